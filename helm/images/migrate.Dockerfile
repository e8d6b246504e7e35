# jobscope schema Job: `python -m stack.create_topics`, then `python -m clickhouse.migrate`
# (build context: the repository root).
FROM python:3.11.7-slim-bookworm AS build
WORKDIR /build
COPY requirements.txt .
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r requirements.txt

FROM python:3.11.7-slim-bookworm
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY clickhouse/ clickhouse/
COPY kafka/ kafka/
RUN useradd --uid 10001 --user-group --no-create-home jobscope
USER 10001:10001
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
CMD ["python", "-m", "clickhouse.migrate"]
