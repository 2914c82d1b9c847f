//! CPU time by process group, from `/proc/<pid>/stat` (Linux), so a load run
//! can say where one saga's CPU went: each service, each database's
//! PostgreSQL backends, PostgreSQL's own background processes, the broker and
//! the generator. The capacity model in docs/performance.md is built from it.
//!
//! A process that exits between two readings takes its CPU with it (the
//! groups then sum to less than the machine's figure from [`crate::cpu`]);
//! the services, the pools' backends and the broker live through a run.

use crate::cpu::TICKS_PER_SEC;
use std::collections::BTreeMap;
use std::path::Path;

/// CPU ticks (user + system) per group, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessCpu {
    /// Per pid: its group and ticks so far, so that a pid seen in both
    /// readings counts only what it spent in between.
    by_pid: BTreeMap<u32, (String, u64)>,
}

impl ProcessCpu {
    /// Reads every process of the machine. A process run from the directory
    /// of this tool's own executable (the build's binaries: the services) is
    /// a group of its own, named after its executable.
    pub fn read() -> Self {
        let bin_dir = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf));
        let mut by_pid = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir("/proc") else { return Self::default() };
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let path = entry.path();
            let (Ok(stat), Ok(cmdline)) =
                (std::fs::read_to_string(path.join("stat")), std::fs::read(path.join("cmdline")))
            else {
                continue;
            };
            let Some((comm, ticks)) = parse_stat(&stat) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let exe = std::fs::read_link(path.join("exe")).ok();
            let built = exe.as_deref().and_then(Path::parent).is_some_and(|d| Some(d) == bin_dir.as_deref());
            let name = exe.as_deref().and_then(Path::file_name).and_then(|n| n.to_str()).unwrap_or(&comm);
            by_pid.insert(pid, (group(name, cmdline.trim(), built, pid), ticks));
        }
        Self { by_pid }
    }

    /// CPU seconds per group from `earlier` to `self`; a pid in both counts
    /// its difference, a pid new since `earlier` all its ticks.
    pub fn since(&self, earlier: &Self) -> BTreeMap<String, f64> {
        let mut secs: BTreeMap<String, f64> = BTreeMap::new();
        for (pid, (group, ticks)) in &self.by_pid {
            let before = earlier.by_pid.get(pid).filter(|(g, _)| g == group).map_or(0, |(_, t)| *t);
            *secs.entry(group.clone()).or_default() += ticks.saturating_sub(before) as f64 / TICKS_PER_SEC;
        }
        secs.retain(|_, s| *s > 0.0);
        secs
    }
}

/// The command name and user + system ticks of a `/proc/<pid>/stat` line.
/// The name is in parentheses and may hold spaces and parentheses itself.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let comm = stat.get(open + 1..close)?.to_string();
    // After the name: state (field 3) ... utime (14), stime (15).
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// The group of a process (`name`: its executable's; `built`: run from the
/// build's binaries). PostgreSQL backends name their database in their title
/// (`postgres: 15/main: <user> <database> <client> <state>`).
fn group(name: &str, cmdline: &str, built: bool, pid: u32) -> String {
    if pid == std::process::id() {
        return "load generator".into();
    }
    if built {
        return name.to_string();
    }
    if let Some(title) = cmdline.strip_prefix("postgres: ") {
        // Skip the cluster name when the title has one (`15/main:`).
        let rest = title.split_once(": ").map_or(title, |(_, r)| r);
        let words: Vec<&str> = rest.split_whitespace().collect();
        // A backend: `<user> <database> <client> <state>`; a background process: its role.
        return match words.as_slice() {
            [_user, db, client, ..] if client.contains('(') || client.starts_with('[') => {
                format!("postgres: {db}")
            }
            _ => "postgres: background".into(),
        };
    }
    if name == "java" && cmdline.contains("kafka.Kafka") {
        return "broker".into();
    }
    "other".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (tokio (worker)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3";
        assert_eq!(parse_stat(line), Some(("tokio (worker)".into(), 325)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn processes_fall_into_their_groups() {
        let g = |name: &str, cmd: &str| group(name, cmd, false, 1);
        assert_eq!(group("order", "/x/target/release/order", true, 1), "order");
        assert_eq!(
            g("postgres", "postgres: 15/main: sagaworks_order_rt sagaworks_load_order 127.0.0.1(5012) idle"),
            "postgres: sagaworks_load_order"
        );
        assert_eq!(g("postgres", "postgres: 15/main: walwriter"), "postgres: background");
        assert_eq!(g("postgres", "postgres: 15/main: autovacuum launcher"), "postgres: background");
        assert_eq!(g("java", "java -cp /x/libs/* kafka.Kafka /x/server.properties"), "broker");
        assert_eq!(g("bash", "bash"), "other");
    }

    #[test]
    fn since_counts_what_each_process_spent_in_between() {
        let at = |v: &[(u32, &str, u64)]| ProcessCpu {
            by_pid: v.iter().map(|(p, g, t)| (*p, (g.to_string(), *t))).collect(),
        };
        let before = at(&[(1, "order", 100), (2, "broker", 50), (3, "other", 10)]);
        let after = at(&[(1, "order", 300), (2, "broker", 50), (4, "order", 20)]);
        let spent = after.since(&before);
        assert_eq!(spent.get("order"), Some(&2.2), "2 s of pid 1 and 0.2 s of the new pid 4");
        assert_eq!(spent.get("broker"), None, "nothing spent");
        assert_eq!(spent.get("other"), None, "exited: gone");
    }
}
