"""What infra/moto_server.py buys: the same requests against moto's own server and against it.

For each server, on a free port: a table of N items takes transactions of one small item
(what submission does), queries of one key (what a read of an order's items does) and queries
of each of an index's 128 shards in turn (what a sweep does), and a queue of N messages takes receives and queue-attribute reads (what the event sources and the
door do). Prints the time per request and the server's memory.

Usage: .venv/bin/python infra/moto_bench.py [N] (default 3000).
"""

import os
import socket
import subprocess
import sys
import time

import boto3

HERE = os.path.dirname(os.path.abspath(__file__))
# Shards of the state table's expiry index.
SHARDS = 128


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def timed(n, call):
    started = time.perf_counter()
    for i in range(n):
        call(i)
    return 1000 * (time.perf_counter() - started) / n


def bench(name, command, n):
    port = free_port()
    server = subprocess.Popen(
        command + ["-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        args = dict(endpoint_url=endpoint, region_name="us-east-1",
                    aws_access_key_id="bench", aws_secret_access_key="bench")
        ddb, sqs = boto3.client("dynamodb", **args), boto3.client("sqs", **args)
        for _ in range(100):
            try:
                ddb.list_tables()
                break
            except Exception:
                time.sleep(0.1)
        ddb.create_table(
            TableName="t", BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"},
                                  {"AttributeName": "s", "AttributeType": "N"}],
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[{
                "IndexName": "by_s", "KeySchema": [{"AttributeName": "s", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"}}])
        body = {"S": "x" * 600}
        for i in range(n):
            ddb.put_item(TableName="t", Item={
                "k": {"S": f"item-{i}"}, "s": {"N": str(i % SHARDS)}, "body": body})
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        for i in range(0, n, 10):
            sqs.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(j), "MessageBody": "m" * 200} for j in range(10)])
        before = rss_mb(server.pid)
        transaction = timed(200, lambda i: ddb.transact_write_items(TransactItems=[{"Put": {
            "TableName": "t", "Item": {"k": {"S": f"new-{i}"}, "body": body},
            "ConditionExpression": "attribute_not_exists(k)"}}]))
        grown = rss_mb(server.pid) - before
        query = timed(100, lambda i: ddb.query(
            TableName="t", KeyConditionExpression="k = :k",
            ExpressionAttributeValues={":k": {"S": f"item-{i}"}}))
        shard = timed(SHARDS, lambda i: ddb.query(
            TableName="t", IndexName="by_s", KeyConditionExpression="s = :s",
            ExpressionAttributeValues={":s": {"N": str(i)}}))
        attributes = timed(100, lambda i: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"]))
        receive = timed(50, lambda i: sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0))
        print(f"| {name} | {transaction:.1f} ms | {grown} MB | {query:.1f} ms | {shard:.1f} ms | {receive:.1f} ms | {attributes:.1f} ms |")
    finally:
        server.kill()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    python = sys.executable
    print(f"{n} items in the table, {n} messages in the queue:\n")
    print("| server | transaction | memory after 200 transactions | query of one key | query of an index's shard | receive of 10 | queue attributes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    bench("moto.server", [python, "-m", "moto.server"], n)
    bench("infra/moto_server.py", [python, os.path.join(HERE, "moto_server.py")], n)


if __name__ == "__main__":
    main()
