"""The operations a user names (verify, watch, export, import by reader...), each opening its transactions over the
domain modules with plain values and returning their dataclasses; the facade (api.py) is a list of calls to these."""
