"""The per-job report: its data (model.py) rendered as HTML, PDF, Markdown or JSON."""
