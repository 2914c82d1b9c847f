/*
 * The pod sandbox's process: it holds the pod's namespaces, reaps the zombies of a pod that
 * shares its process namespace and exits on SIGINT or SIGTERM. The same job as
 * registry.k8s.io/pause, which cannot be pulled here; built static (gcc -static) into an
 * image of one file by scripts/lib/k8s-build.sh.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    struct sigaction act;
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (sagaworks)");
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: not the first process of its PID namespace\n", stderr);
    }
    memset(&act, 0, sizeof act);
    act.sa_handler = on_stop;
    if (sigaction(SIGINT, &act, NULL) < 0 || sigaction(SIGTERM, &act, NULL) < 0) {
        return 1;
    }
    act.sa_handler = on_child;
    act.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &act, NULL) < 0) {
        return 2;
    }
    for (;;) {
        pause();
    }
}
