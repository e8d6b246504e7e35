"""The embedded default: starts, checks and stops every jobscope process on one machine."""
