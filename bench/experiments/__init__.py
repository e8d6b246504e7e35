"""Lab notebooks of single issues, out of `make bench`: each module says what it was for."""
