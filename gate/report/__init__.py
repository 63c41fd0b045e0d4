"""Report formats, one module each (json, junit, markdown, console, html with its Jinja2
template under templates/), each registering itself in registry.py; interface.py holds
ReportFormat, document.py the Report document, explain.py what `gate explain` prints."""
