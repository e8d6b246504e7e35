# Kafka Connect workers from the broker's own jars (kafka/pom.xml: Kafka 4.3.1, with
# connect-runtime and MirrorMaker 2) (build context: the repository root).
FROM maven:3.9.9-eclipse-temurin-17 AS build
WORKDIR /build
COPY kafka/pom.xml .
RUN mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/opt/kafka/libs

FROM eclipse-temurin:17.0.15_6-jre
COPY --from=build /opt/kafka/libs /opt/kafka/libs
COPY kafka/log4j2.yaml /opt/kafka/config/log4j2.yaml
COPY helm/images/connect-entrypoint.sh /opt/kafka/connect-entrypoint.sh
RUN useradd --uid 10001 --user-group --no-create-home jobscope
USER 10001:10001
EXPOSE 8083
ENTRYPOINT ["/opt/kafka/connect-entrypoint.sh"]
