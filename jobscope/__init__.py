"""jobscope's user side: the `jobscope` command line and the Python client (`jobscope.client`).

Installed with `pip install .[client]`; the server (api/, producers/) does not need it.
"""
