"""Starts moto's server for the local stack and the tests, with its worst costs taken away.

moto is one Python process serving every request under one interpreter lock, and some of its
work grows with the data it holds:

- it keeps every model object it ever creates in a class-level list, so that its dashboard can
  show them: every message, every item, and every copy of a table;
- it backs up a DynamoDB transaction by deep-copying each table the transaction touches,
  whatever their size; with the above, a transaction costs time and memory in proportion to
  the table, for ever: a few thousand orders take gigabytes;
- an SQS queue's attributes are built whole (counting every message, three ways) each time one
  of them is read, once per attribute asked for, once per message received (to read its
  retention period), and once per message sent (to read whether it deduplicates by content):
  receiving from a long queue costs the square of its length, and so does filling a queue
  nobody reads (an event rule's target, such as the order events' queue);
- it looks for its own service modules on disk, and logs, for every request.

Here, objects are not tracked (nothing in the local stack reads the dashboard); a transaction
backs up only the items it touches and puts them back if it is cancelled; a queue's attributes
are built once per call, a message sent builds only those it reads, and a message's retention
is checked against the queue's setting directly; the list of modules is read once, and requests
are not logged. What DynamoDB and SQS do is unchanged: the contract tests check it on this
server.

moto serves requests on several threads, and a conditional write checks its condition and then
writes as two steps that another thread's write can come between. DynamoDB applies each write
to an item atomically, and the services table's turns depend on it; here every DynamoDB write,
and every read of items by key, holds one lock while it runs. Queries and scans do not: they
walk copies of the table's collections, so that a long scan does not stop every other call.
moto picks a query's partition out of the whole table, sorted, which made every read of one
order cost in proportion to all the orders ever made; here it reads that partition alone. A
query of an index walks the items grouped by the value it names, grouped once after each
write rather than walking the whole table for every query.

moto takes MessageGroupId on a standard queue and keeps it, but delivers in sending order; SQS
makes such a queue a fair queue. Here a receive from a standard queue hands out messages as a
fair queue does: a group (a tenant) is noisy while it holds more than a tenth of the messages in
flight and at least 30 of them, or took more than a tenth of the consumers' time lately (from
receive to delete, halving every minute); while any group is noisy, the quiet groups' messages
come first, then the noisy groups', the next from whichever has the fewest in flight. A message
without a group is a tenant of its own. The engine's in-memory queues decide by the same rule.

Usage: python moto_server.py -H 127.0.0.1 -p PORT (the arguments of moto.server).
"""

import copy
import json
import logging
import sys
import threading

import moto.backends
from moto.core import common_models
from moto.core.utils import camelcase_to_underscores, unix_time
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.table import Table
from moto.server import main
from moto.sqs.models import Queue, SQSBackend


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

_dynamodb = threading.RLock()

# DynamoDB writes made so far: what an index query's buckets (below) were built after.
_writes = [0]


def _atomic(method):
    def call(self, *args, **kwargs):
        with _dynamodb:
            return method(self, *args, **kwargs)

    return call


def _atomic_write(method):
    def call(self, *args, **kwargs):
        with _dynamodb:
            try:
                return method(self, *args, **kwargs)
            finally:
                _writes[0] += 1

    return call


# Writes, and the reads DynamoDB serialises with them. A query or a scan may see part of a
# transaction on DynamoDB too (read-committed per item), and holding the lock for one would stop
# every other call for as long as it takes, which grows with the table.
for _name in ("get_item", "batch_get_item", "transact_get_items"):
    setattr(DynamoDBBackend, _name, _atomic(getattr(DynamoDBBackend, _name)))
for _name in (
    "put_item",
    "update_item",
    "delete_item",
    "batch_write_item",
    "transact_write_items",
):
    setattr(DynamoDBBackend, _name, _atomic_write(getattr(DynamoDBBackend, _name)))

# Unlocked, a query or a scan walks the table's items while other threads write: it walks a
# copy of each collection (taken whole under the interpreter lock), not the collection itself.
# A query sorts what it found by itself, so the items it walks need no order: moto sorted the
# whole table for every query. A query of the table (not an index) walks only its partition,
# as DynamoDB reads one partition, instead of the whole table to pick it out.
_querying = threading.local()


def _items(self, partition=None):
    if partition is None:
        sets = list(self.items.values())
    else:
        found = self.items.get(partition)
        sets = [] if found is None else [found]
    if not self.range_key_attr:
        return sets
    return [item for hash_set in sets for item in list(hash_set.values())]


def all_items(self):
    within = getattr(_querying, "table", None)
    if within is not None and within[0] is self:
        return within[2] if within[2] is not None else _items(self, within[1])
    return sorted(_items(self), key=lambda x: (x.hash_key, x.range_key) if x.range_key else x.hash_key)


def has_idx_items(self, index_name):
    names = {i["AttributeName"] for i in self.get_index(index_name).schema}
    return [item for item in _items(self) if names.issubset(item.attrs)]


_query = Table.query


def _index_bucket(table, conditions):
    """The items whose attribute equals the one value a query of an index names, or None.

    The items are grouped by that attribute's value once per write, not walked whole for each
    query: a sweep queries every shard of an index in turn."""
    if not conditions or len(conditions) != 1:
        return None
    name, value = conditions[0]
    version = _writes[0]
    cache = table.__dict__.setdefault("_buckets", {})
    built = cache.get(name)
    if built is None or built[0] != version:
        buckets = {}
        for item in _items(table):
            found = item.attrs.get(name)
            if found is not None:
                buckets.setdefault(found, []).append(item)
        built = (version, buckets)
        cache[name] = built
    return built[1].get(value, [])


def query(self, hash_key, *args, **kwargs):
    index_name = kwargs.get("index_name", args[6] if len(args) > 6 else None)
    if index_name is None:
        _querying.table = (self, hash_key, None)
    else:
        _querying.table = (self, None, _index_bucket(self, kwargs.get("hash_key_conditions")))
    try:
        return _query(self, hash_key, *args, **kwargs)
    finally:
        _querying.table = None


Table.all_items = all_items
Table.has_idx_items = has_idx_items
Table.query = query

# A queue's attributes, built once per call of get_queue_attributes rather than once per name.
_built = threading.local()
_attributes = Queue.attributes.fget


class _AttributesAsRead(dict):
    """A queue's attributes, each built when it is read: all that sending a message reads of
    them is whether the queue deduplicates by content."""

    def __init__(self, queue):
        super().__init__()
        self._queue = queue

    def __missing__(self, name):
        queue = self._queue
        names = list(queue.BASE_ATTRIBUTES)
        if queue.fifo_queue:
            names += queue.FIFO_ATTRIBUTES
        if queue.kms_master_key_id:
            names += queue.KMS_ATTRIBUTES
        if name == "Policy" and queue.policy:
            return queue.policy
        if name == "RedrivePolicy" and queue.redrive_policy:
            return json.dumps(queue.redrive_policy)
        if name not in names:
            raise KeyError(name)
        value = getattr(queue, camelcase_to_underscores(name))
        return str(value).lower() if isinstance(value, bool) else value

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default


def _queue_attributes(queue):
    if getattr(_built, "as_read", False):
        return _AttributesAsRead(queue)
    memo = getattr(_built, "memo", None)
    if memo is None:
        return _attributes(queue)
    if id(queue) not in memo:
        memo[id(queue)] = _attributes(queue)
    return memo[id(queue)]


Queue.attributes = property(_queue_attributes)
_get_queue_attributes = SQSBackend.get_queue_attributes


def get_queue_attributes(self, queue_name, attribute_names):
    _built.memo = {}
    try:
        return _get_queue_attributes(self, queue_name, attribute_names)
    finally:
        _built.memo = None


_send_message = SQSBackend.send_message


def send_message(self, *args, **kwargs):
    _built.as_read = True
    try:
        return _send_message(self, *args, **kwargs)
    finally:
        _built.as_read = False


def is_message_valid_based_on_retention_period(self, queue_name, message):
    retention = int(self.get_queue(queue_name).message_retention_period)
    return message.sent_timestamp / 1000 + retention > unix_time()


SQSBackend.get_queue_attributes = get_queue_attributes
SQSBackend.send_message = send_message
SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period

# Fair queues. What each group took of the consumers' time, by queue: {id(queue): {group:
# (seconds, at)}}, halving every FAIR_HALF_LIFE seconds.
FAIR_HALF_LIFE = 60.0
NOISY_SHARE = 0.1
NOISY_IN_FLIGHT = 30
_fair_time = {}
_fair_lock = threading.Lock()
_receiving = threading.local()


def _decayed(seconds, at, now):
    return seconds * 0.5 ** ((now - at) / FAIR_HALF_LIFE)


def _worked(queue, group, took, now):
    with _fair_lock:
        times = _fair_time.setdefault(id(queue), {})
        seconds, at = times.get(group, (0.0, now))
        times[group] = (_decayed(seconds, at, now) + took, now)


def _fair(queue, visible):
    """The visible messages of a standard queue in the order a fair queue delivers them."""
    # With the messages waiting all of one group, there is nothing to put first.
    if len({m.group_id for m in visible}) < 2:
        return visible
    now = unix_time()
    in_flight = {}
    for m in queue._messages:
        if m.group_id is not None and m.approximate_receive_count > 0 and not m.visible:
            in_flight[m.group_id] = in_flight.get(m.group_id, 0) + 1
    for m in visible:
        if m.group_id is not None:
            in_flight.setdefault(m.group_id, 0)
    with _fair_lock:
        times = {g: _decayed(c, at, now) for g, (c, at) in _fair_time.get(id(queue), {}).items()}
    busy = sum(times.values())
    groups = max(len(in_flight), len([c for c in times.values() if c > 0]))
    if groups < 2:
        return visible
    flying = sum(in_flight.values())
    noisy = {
        g
        for g, n in in_flight.items()
        if (n >= NOISY_IN_FLIGHT and n > NOISY_SHARE * flying)
        or (busy > 0 and times.get(g, 0.0) > NOISY_SHARE * busy)
    }
    if not noisy:
        return visible
    order = []
    waiting = {}
    for m in visible:
        if m.group_id in noisy:
            waiting.setdefault(m.group_id, []).append(m)
        else:
            order.append(m)
    heads = {g: 0 for g in waiting}
    while heads:
        g = min(heads, key=lambda g: in_flight.get(g, 0))
        order.append(waiting[g][heads[g]])
        in_flight[g] = in_flight.get(g, 0) + 1
        heads[g] += 1
        if heads[g] == len(waiting[g]):
            del heads[g]
    return order


_messages = Queue.messages.fget


def _messages_in_turn(self):
    visible = _messages(self)
    if getattr(_receiving, "on", False) and not self.fifo_queue:
        return _fair(self, visible)
    return visible


Queue.messages = property(_messages_in_turn)
_receive_message = SQSBackend.receive_message
# When each grouped message handed out was received, with its group, by receipt: its consumer's
# time on it ends when that receipt deletes it. Receipts never used are forgotten, oldest first.
_received = {}
MAX_RECEIPTS = 100_000


def receive_message(self, *args, **kwargs):
    _receiving.on = True
    try:
        received = _receive_message(self, *args, **kwargs)
    finally:
        _receiving.on = False
    now = unix_time()
    with _fair_lock:
        for m in received:
            if m.group_id is not None:
                _received[m.receipt_handle] = (now, m.group_id)
        while len(_received) > MAX_RECEIPTS:
            del _received[next(iter(_received))]
    return received


_queue_delete_message = Queue.delete_message


def queue_delete_message(self, receipt_handle):
    _queue_delete_message(self, receipt_handle)
    with _fair_lock:
        found = _received.pop(receipt_handle, None)
    if found is not None:
        now = unix_time()
        _worked(self, found[1], max(now - found[0], 0.001), now)


SQSBackend.receive_message = receive_message
Queue.delete_message = queue_delete_message

_modules = frozenset(moto.backends.list_of_moto_modules())
moto.backends.list_of_moto_modules = lambda: _modules
logging.getLogger("werkzeug").disabled = True

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
