"""SQL of the API, one module per concern; every value is a bound parameter."""
