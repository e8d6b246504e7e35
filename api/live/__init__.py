"""Live readings of a job: `hub` reads the readings topic once per API process and hands
each message to the streams of its device, `stream` makes one client's Server-Sent Events
(replay from ClickHouse, then live, joined without gap or duplicate), `scope` decides which
readings a job's stream shows and how, `sse` writes the events."""
