#!/bin/sh
# Kafka Connect worker in distributed mode, configured from the environment the chart sets.
# Secrets never go into a configuration: the worker's Kafka password and the connectors'
# secrets are named as ${env:NAME} (EnvVarConfigProvider) and resolved from the environment
# (Secrets) when used, so neither this file nor the configs topic holds them.
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
config.providers=env,file
config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider
config.providers.file.class=org.apache.kafka.common.config.provider.FileConfigProvider
PROPERTIES
protocol=${JOBSCOPE_KAFKA_SECURITY_PROTOCOL:-PLAINTEXT}
if [ "$protocol" != PLAINTEXT ]; then
    jaas="org.apache.kafka.common.security.scram.ScramLoginModule required"
    jaas="$jaas username=\"${JOBSCOPE_KAFKA_SASL_USERNAME}\""
    jaas="$jaas password=\"\${env:JOBSCOPE_KAFKA_SASL_PASSWORD}\";"
    # the worker's own clients, and those it creates for connectors
    for prefix in "" producer. consumer. admin.; do
        {
            echo "${prefix}security.protocol=${protocol}"
            echo "${prefix}sasl.mechanism=${JOBSCOPE_KAFKA_SASL_MECHANISM}"
            echo "${prefix}sasl.jaas.config=${jaas}"
            if [ -n "${JOBSCOPE_KAFKA_SSL_CA_FILE:-}" ]; then
                echo "${prefix}ssl.truststore.type=PEM"
                echo "${prefix}ssl.truststore.location=${JOBSCOPE_KAFKA_SSL_CA_FILE}"
            fi
        } >> "$config"
    done
fi
exec java -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml \
    -cp '/opt/kafka/libs/*' org.apache.kafka.connect.cli.ConnectDistributed "$config"
