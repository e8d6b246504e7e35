# Kafka Connect workers from the broker's Kafka release (connectors/pom.xml: Kafka 4.3.1's
# connect-runtime and MirrorMaker 2) with each plugin of connectors/plugins/ (Debezium's
# PostgreSQL source) in its own directory of the plugin path, as `make connect` runs them
# (build context: the repository root).
FROM maven:3.9.9-eclipse-temurin-17 AS build
WORKDIR /build
COPY connectors/pom.xml connectors/pom.xml
COPY connectors/plugins/ connectors/plugins/
RUN mvn -q -B -f connectors/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory=/opt/kafka/libs \
    && for pom in connectors/plugins/*/pom.xml; do \
        mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
            -DoutputDirectory="/opt/kafka/plugins/$(basename "$(dirname "$pom")")"; \
    done

FROM eclipse-temurin:17.0.15_6-jre
COPY --from=build /opt/kafka/libs /opt/kafka/libs
COPY --from=build /opt/kafka/plugins /opt/kafka/plugins
COPY kafka/log4j2.yaml /opt/kafka/config/log4j2.yaml
COPY helm/images/connect-entrypoint.sh /opt/kafka/connect-entrypoint.sh
RUN useradd --uid 10001 --user-group --no-create-home jobscope
USER 10001:10001
EXPOSE 8083
ENTRYPOINT ["/opt/kafka/connect-entrypoint.sh"]
