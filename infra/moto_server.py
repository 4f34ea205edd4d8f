"""Starts moto's server for the local stack and the tests, with two of its costs taken away.

moto keeps every model object it ever creates in a class-level list, so that its dashboard can
show them: every message, every item, and every copy of a table. And it backs up a transaction
by deep-copying each table the transaction touches, whatever their size. Together they make a
transaction cost time and memory in proportion to the table, for ever: a few thousand orders
take gigabytes and slow every other DynamoDB call, which share the interpreter's lock.

Here, objects are not tracked (nothing in the local stack reads the dashboard), and a
transaction backs up only the items it touches and puts them back if it is cancelled. What
DynamoDB does is unchanged: the contract tests check it on this server.

Usage: python moto_server.py -H 127.0.0.1 -p PORT (the arguments of moto.server).
"""

import copy
import sys

from moto.core import common_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.table import Table
from moto.server import main


def _untracked(cls, *args, **kwargs):
    return object.__new__(cls)


common_models.BaseModel.__new__ = staticmethod(_untracked)

# The transaction below backs up items, not tables: a table handed to deepcopy is the table.
Table.__deepcopy__ = lambda self, memo: self

_transact_write_items = DynamoDBBackend.transact_write_items


def _touched_keys(backend, transact_items):
    """(table name, key) of every item the transaction writes or checks."""
    for entry in transact_items:
        if len(entry) != 1:
            continue  # moto refuses it; nothing to back up
        op_type, op = next(iter(entry.items()))
        table = backend.tables.get(op.get("TableName"))
        if table is None:
            continue
        if op_type == "Put":
            names = [table.hash_key_attr, table.range_key_attr]
            key = {n: op["Item"][n] for n in names if n is not None and n in op["Item"]}
        else:
            key = op.get("Key")
        if key:
            yield table.name, key


def transact_write_items(self, transact_items):
    backup = []
    for table_name, key in _touched_keys(self, transact_items):
        try:
            item = self.get_item(table_name, key)
        except Exception:
            continue  # a malformed key: moto reports it, and it writes nothing
        backup.append((table_name, key, copy.deepcopy(item) if item is not None else None))
    try:
        return _transact_write_items(self, transact_items)
    except Exception:
        # Cancelled: whatever the transaction wrote before it failed is put back.
        for table_name, key, item in reversed(backup):
            if item is None:
                self.delete_item(table_name, key)
            else:
                self.put_item(table_name, item.to_json()["Attributes"])
        raise


DynamoDBBackend.transact_write_items = transact_write_items

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
