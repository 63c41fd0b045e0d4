"""Report formats, one module each: json.py, junit.py, console.py."""
