#!/usr/bin/env bash
# Starts single-node Apache Kafka (KRaft: broker and controller in one process) the way
# scripts/kafka's secure mode runs it locally. It replaces the apache/kafka image's own
# entrypoint in docker-compose.yml (`kafka`) and in the k8s dev overlay (StatefulSet
# `kafka`, this file as the ConfigMap `kafka-start` of the component
# deploy/kafka/kustomization.yaml), because the SCRAM users must exist when the storage is
# formatted, and the image's entrypoint formats without them.
#
#   client listener      SASL_SSL on $CLIENT_PORT: SCRAM-SHA-512 over TLS, the broker's
#                        certificate and key as PEM, the truststore the Kafka CA (PEM)
#   controller listener  SSL on $CONTROLLER_PORT with client authentication required:
#                        only a certificate of the Kafka CA passes: the broker's own
#                        (CN=kafka, a super user). The Kafka CA issues the Kafka nodes'
#                        certificates only, never the services' (their SPIFFE identities
#                        come from a CA of their own), so no service certificate, whatever
#                        its name, gets past this handshake
#   authorization        StandardAuthorizer, allow.everyone.if.no.acl.found=false,
#                        super.users=User:admin;User:CN=kafka. The services' ACLs are
#                        added by the topic-creating init step (compose `kafka-init`, the
#                        k8s Job `kafka-topics`) from deploy/kafka/acls.txt
#   users                `admin` (the broker's own, for the inter-broker listener and the
#                        tools) and each of $SCRAM_USERS, created by `kafka-storage.sh
#                        format --add-scram` on the first start. On a formatted log
#                        directory the format is skipped (--ignore-formatted), so a
#                        changed password takes a fresh log directory (compose: `docker
#                        compose down`; k8s: delete the StatefulSet's PVC).
#
# Environment:
#   CLUSTER_ID          the cluster id the storage is formatted with (required)
#   NODE_ID             default 1
#   LISTEN_HOST         the listeners' bind address (default: every interface)
#   CLIENT_PORT         default 9092
#   CONTROLLER_PORT     default 9093
#   ADVERTISED_HOST     the client listener's advertised name (required; the certificate
#                       must carry it as a DNS or IP SAN)
#   CONTROLLER_HOST     the voter's address for controller.quorum.voters (default
#                       localhost; the certificate must carry it)
#   LOG_DIRS            the log directory (required)
#   TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE
#                       the broker's certificate, its PKCS#8 key, and the Kafka CA (PEM)
#                       that issued it: the controller listener's only trusted CA, which
#                       must not be the CA of the services' certificates
#   ADMIN_KAFKA_PASSWORD
#                       the password of `admin`
#   SCRAM_USERS         the users besides admin, space-separated (the backends of
#                       services.toml); <USER>_KAFKA_PASSWORD holds each one's password
#                       (e.g. ORDER_KAFKA_PASSWORD)
#   RUN_DIR             where server.properties, keystore.pem and admin.properties (the
#                       admin's client configuration, for the healthcheck and the tools)
#                       are written, mode 0600 (default /tmp/sagaworks-kafka)
#   KAFKA_BIN           Kafka's bin/ directory (default /opt/kafka/bin)
set -euo pipefail

die() { echo "kafka start.sh: $*" >&2; exit 1; }
need() { [ -n "${!1:-}" ] || die "$1 must be set"; }

for var in CLUSTER_ID ADVERTISED_HOST LOG_DIRS TLS_CERT_FILE TLS_KEY_FILE TLS_CA_FILE ADMIN_KAFKA_PASSWORD; do
    need "$var"
done
for file in "$TLS_CERT_FILE" "$TLS_KEY_FILE" "$TLS_CA_FILE"; do
    [ -r "$file" ] || die "cannot read $file"
done
NODE_ID="${NODE_ID:-1}"
LISTEN_HOST="${LISTEN_HOST:-}"
CLIENT_PORT="${CLIENT_PORT:-9092}"
CONTROLLER_PORT="${CONTROLLER_PORT:-9093}"
CONTROLLER_HOST="${CONTROLLER_HOST:-localhost}"
RUN_DIR="${RUN_DIR:-/tmp/sagaworks-kafka}"
KAFKA_BIN="${KAFKA_BIN:-/opt/kafka/bin}"

# A password inside the JAAS line's double quotes and in --add-scram's [...]: no quote,
# backslash, comma, bracket or whitespace (scripts/compose-env's are base64 without +/=).
check_password() { # user, password
    [ -n "$2" ] || die "no password for the Kafka user $1"
    [[ "$2" =~ ^[A-Za-z0-9._~-]+$ ]] || die "the password of the Kafka user $1 must be [A-Za-z0-9._~-]+"
}

check_password admin "$ADMIN_KAFKA_PASSWORD"
scram=(--add-scram "SCRAM-SHA-512=[name=admin,password=$ADMIN_KAFKA_PASSWORD]")
for user in ${SCRAM_USERS:-}; do
    [[ "$user" =~ ^[a-z][a-z0-9]*$ ]] || die "SCRAM_USERS: $user is no user name ([a-z][a-z0-9]*)"
    var="${user^^}_KAFKA_PASSWORD"
    check_password "$user" "${!var:-}"
    scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=${!var}]")
done

umask 077
mkdir -p "$RUN_DIR" "$LOG_DIRS"
# The keystore: the key, then the certificate (as they are now: a re-issued certificate
# is picked up by the next start).
cat "$TLS_KEY_FILE" "$TLS_CERT_FILE" >"$RUN_DIR/keystore.pem"

cat >"$RUN_DIR/server.properties" <<PROPS
# Written by deploy/kafka/start.sh.
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$NODE_ID@$CONTROLLER_HOST:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=SASL_SSL://$LISTEN_HOST:$CLIENT_PORT,CONTROLLER://$LISTEN_HOST:$CONTROLLER_PORT
advertised.listeners=SASL_SSL://$ADVERTISED_HOST:$CLIENT_PORT
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$ADMIN_KAFKA_PASSWORD";
# The controller listener admits a client certificate of the Kafka CA only; the broker
# presents its own (the keystore below) when it connects to it.
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PEM
ssl.keystore.location=$RUN_DIR/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_CA_FILE
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:CN=kafka
log.dirs=$LOG_DIRS
num.partitions=3
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Topics are created explicitly (the init step, and the services with their partitions
# and replication factor), never by a client's first produce or subscribe.
auto.create.topics.enable=false
# A consumer group's first rebalance starts at once (the default waits 3 s for more members).
group.initial.rebalance.delay.ms=0
PROPS

cat >"$RUN_DIR/admin.properties" <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$ADMIN_KAFKA_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_CA_FILE
PROPS

"$KAFKA_BIN/kafka-storage.sh" format --ignore-formatted --cluster-id "$CLUSTER_ID" \
    --config "$RUN_DIR/server.properties" "${scram[@]}"
exec "$KAFKA_BIN/kafka-server-start.sh" "$RUN_DIR/server.properties"
