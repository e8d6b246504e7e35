# jobscope producers: `python -m producers --shard i/N` (build context: the repository root).
FROM python:3.11.7-slim-bookworm AS build
WORKDIR /build
COPY requirements.txt .
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r requirements.txt

FROM python:3.11.7-slim-bookworm
# FreeIPMI's ipmi-sensors: the ipmisensor:// plugin runs it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends freeipmi-tools=1.6.10-1+b1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY producers/ producers/
COPY kafka/ kafka/
RUN useradd --uid 10001 --user-group --no-create-home jobscope
USER 10001:10001
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ENTRYPOINT ["python", "-m", "producers"]
