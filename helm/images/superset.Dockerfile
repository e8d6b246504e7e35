# Superset with jobscope's configuration and dashboards, from superset/requirements.txt
# (build context: the repository root).
FROM python:3.11.7-slim-bookworm AS build
WORKDIR /build
COPY superset/requirements.txt .
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r requirements.txt

FROM python:3.11.7-slim-bookworm
COPY --from=build /opt/venv /opt/venv
# Not under a folder named superset on the path: it would shadow the installed package.
WORKDIR /opt/jobscope
COPY superset/ superset-config/
RUN useradd --uid 10001 --user-group --no-create-home jobscope
USER 10001:10001
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    SUPERSET_CONFIG_PATH=/opt/jobscope/superset-config/superset_config.py SUPERSET_PORT=8088 \
    SUPERSET_HOME=/tmp/superset
EXPOSE 8088
ENTRYPOINT ["sh", "-c", "exec gunicorn -w 2 -k gthread --threads 2 -b 0.0.0.0:${SUPERSET_PORT} 'superset.app:create_app()'"]
