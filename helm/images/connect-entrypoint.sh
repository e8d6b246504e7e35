#!/bin/sh
# Kafka Connect worker in distributed mode, configured from the environment the chart sets.
set -eu
config=/tmp/connect-distributed.properties
cat > "$config" <<PROPERTIES
bootstrap.servers=${CONNECT_BOOTSTRAP_SERVERS}
group.id=${CONNECT_GROUP_ID}
listeners=http://0.0.0.0:${CONNECT_REST_PORT}
config.storage.topic=${CONNECT_GROUP_ID}-configs
offset.storage.topic=${CONNECT_GROUP_ID}-offsets
status.storage.topic=${CONNECT_GROUP_ID}-status
config.storage.replication.factor=${CONNECT_REPLICATION_FACTOR}
offset.storage.replication.factor=${CONNECT_REPLICATION_FACTOR}
status.storage.replication.factor=${CONNECT_REPLICATION_FACTOR}
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter.schemas.enable=false
plugin.path=/opt/kafka/plugins
PROPERTIES
exec java -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml \
    -cp '/opt/kafka/libs/*' org.apache.kafka.connect.cli.ConnectDistributed "$config"
