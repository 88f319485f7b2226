"""The serving benchmark's parts: the load runner (`load.py`), its raw HTTP/1.1 client (`rawhttp.py`),
the report (`report.py`) and the plots (`plots.py`)."""
