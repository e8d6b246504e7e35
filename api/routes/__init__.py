"""One router per resource; api/main.py only includes them."""
