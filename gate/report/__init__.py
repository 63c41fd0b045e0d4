"""Report formats, one module each (json.py, junit.py, markdown.py, console.py), each registering
itself in registry.py; interface.py holds ReportFormat, document.py the Report document."""
