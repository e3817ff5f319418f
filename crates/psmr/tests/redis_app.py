"""A small application on Redis, written as its users write one with
redis-py: a cache with TTLs, counters, a profile in a hash, a job queue on a
list, a leaderboard on a sorted set, tags in sets, pipelines (transactions,
redis-py's default), an optimistic transaction with WATCH, and a scan of the
key space.

It prints one JSON line per step: the step's name and what it saw. Where
Redis leaves the exact answer open (a TTL counts down, a set has no order)
the value is normalized (a TTL is checked against its range, members are
sorted), so that two servers that behave alike print the same lines.

    redis_app.py steps HOST PORT          every step, once, on emptied stores
    redis_app.py counter HOST PORT N KEY  N optimistic increments of KEY

crates/psmr/tests/redis_py.rs runs it against redis-server and psmr.
"""

import json
import sys

import redis


def step(name, value):
    print(json.dumps([name, value], sort_keys=True), flush=True)


def attempt(f):
    """What f() returns, or the error Redis answered."""
    try:
        return f()
    except redis.ResponseError as e:
        return ["error", str(e)]


def strings(r):
    step("ping", r.ping())
    step("set/get", [r.set("greeting", "hello"), r.get("greeting"), r.get("missing")])
    step("incr", [r.incr("visits"), r.incr("visits", 5), r.decr("visits"), r.incrbyfloat("ratio", 0.5)])
    step("set nx/xx", [r.set("once", "1", nx=True), r.set("once", "2", nx=True), r.set("nobody", "x", xx=True)])
    step("mset/mget", [r.mset({"k1": "v1", "k2": "v2"}), r.mget("k1", "k2", "k3"), r.msetnx({"k1": "x", "k9": "y"})])
    step("append/strlen/getrange", [r.append("greeting", " world"), r.strlen("greeting"), r.getrange("greeting", 0, 4)])
    step("wrong type", attempt(lambda: r.lpush("greeting", "x")))
    step("not an integer", attempt(lambda: r.incr("greeting")))


def expiry(r):
    r.set("cache:page", "<html>", ex=60)
    ttl = r.ttl("cache:page")
    step("set ex / ttl", [r.get("cache:page"), 55 <= ttl <= 60, r.ttl("missing"), r.pttl("greeting")])
    r.set("session", "x")
    step("expire", [r.expire("session", 100), 95 <= r.ttl("session") <= 100, r.expire("missing", 5)])
    step("persist", [r.persist("session"), r.ttl("session"), r.persist("session")])
    r.setex("token", 30, "t")
    step("setex/getex", [25 <= r.ttl("token") <= 30, r.getex("token", persist=True), r.ttl("token")])
    step("a deadline already past", [r.set("gone", "x"), r.pexpire("gone", -1), r.exists("gone")])


def hashes(r):
    step("hset", r.hset("user:1", mapping={"name": "ada", "visits": "0"}))
    step("hgetall", r.hgetall("user:1"))
    step("hincrby/hget", [r.hincrby("user:1", "visits", 3), r.hget("user:1", "name"), r.hget("user:1", "x")])
    step("hexists/hlen/hkeys", [r.hexists("user:1", "x"), r.hlen("user:1"), sorted(r.hkeys("user:1"))])
    step("hdel", [r.hdel("user:1", "name", "x"), r.hgetall("user:1"), r.hsetnx("user:1", "visits", "9")])


def queue(r):
    step("push", [r.lpush("jobs", "j1", "j2"), r.rpush("jobs", "j0"), r.llen("jobs"), r.lrange("jobs", 0, -1)])
    step("pop", [r.rpop("jobs"), r.lpop("jobs"), r.brpop("jobs", timeout=1), r.llen("jobs")])
    step("blocking pop times out", r.brpop("nothing", timeout=1))
    step("lmove", [r.rpush("todo", "a", "b"), r.lmove("todo", "doing", "LEFT", "RIGHT"), r.lrange("doing", 0, -1)])
    step("lrem/lindex/lset", [r.rpush("l", "x", "y", "x"), r.lrem("l", 0, "x"), r.lindex("l", 0), r.lset("l", 0, "z")])


def leaderboard(r):
    step("zadd", r.zadd("board", {"ada": 30, "bob": 10, "cy": 20}))
    step("zincrby", r.zincrby("board", 15, "bob"))
    step("top", r.zrevrange("board", 0, 2, withscores=True))
    step("ranks", [r.zrank("board", "cy"), r.zrevrank("board", "bob"), r.zscore("board", "ada"), r.zscore("board", "x")])
    step("by score", [r.zrangebyscore("board", 15, "+inf"), r.zcount("board", "-inf", 20), r.zcard("board")])
    step("zpopmin/zrem", [r.zpopmin("board"), r.zrem("board", "ada", "x"), r.zrange("board", 0, -1)])


def tags(r):
    step("sadd", [r.sadd("tags:1", "a", "b", "c"), r.sadd("tags:2", "b", "c", "d"), r.sadd("tags:1", "a")])
    step("combine", [sorted(r.sinter("tags:1", "tags:2")), sorted(r.sunion("tags:1", "tags:2")), sorted(r.sdiff("tags:1", "tags:2"))])
    step("members", [r.sismember("tags:1", "a"), r.scard("tags:2"), sorted(r.smembers("tags:1")), r.srem("tags:1", "a", "z")])
    step("smove/sinterstore", [r.smove("tags:1", "tags:3", "b"), r.sinterstore("both", ["tags:1", "tags:2"]), sorted(r.smembers("both"))])


def transactions(r):
    pipe = r.pipeline()
    pipe.set("a", 1).incr("a").get("a").mget("a", "missing")
    step("pipeline", pipe.execute())
    pipe = r.pipeline(transaction=False)
    pipe.incr("a").incr("a").get("a")
    step("pipeline, no transaction", pipe.execute())

    def add_ten(pipe):
        n = int(pipe.get("visits") or 0)
        pipe.multi()
        pipe.set("visits", n + 10)
        pipe.get("visits")

    step("watched transaction", r.transaction(add_ten, "visits"))
    # Another client changes the key between WATCH and EXEC: nothing runs.
    pipe = r.pipeline()
    pipe.watch("visits")
    other = redis.Redis(connection_pool=r.connection_pool)
    other.incr("visits")
    pipe.multi()
    pipe.set("visits", 0)
    step("watched key changed", watch_error(pipe))
    step("after it", r.get("visits"))


def watch_error(pipe):
    try:
        pipe.execute()
        return "ran"
    except redis.WatchError:
        return "aborted"


def keyspace(r):
    for i in range(20):
        r.set(f"scan:{i}", i)
    step("scan_iter", sorted(r.scan_iter(match="scan:1*", count=5)))
    step("scan_iter by type", sorted(r.scan_iter(match="tags:*", _type="set")))
    step("keys", sorted(r.keys("user:*")))
    step("type", [r.type(k) for k in ["board", "jobs", "user:1", "tags:2", "greeting", "none"]])
    step("exists/delete", [r.exists("greeting", "missing", "greeting"), r.delete("greeting", "missing"), r.exists("greeting")])
    step("rename", [r.rename("k1", "k1b"), r.get("k1b"), r.renamenx("k1b", "k2"), attempt(lambda: r.rename("nothing", "x"))])
    step("unlink/dbsize", [r.unlink("k1b", "k2"), r.dbsize() > 20])


def steps(host, port):
    r = redis.Redis(host=host, port=port, decode_responses=True)
    r.flushall()
    for part in [strings, expiry, hashes, queue, leaderboard, tags, transactions, keyspace]:
        part(r)


def counter(host, port, n, key):
    r = redis.Redis(host=host, port=port, decode_responses=True)

    def increment(pipe):
        value = int(pipe.get(key) or 0)
        pipe.multi()
        pipe.set(key, value + 1)

    for _ in range(n):
        r.transaction(increment, key)
    step("increments", n)


if __name__ == "__main__":
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "steps":
        steps(host, port)
    elif mode == "counter":
        counter(host, port, int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(f"unknown mode {mode!r}: steps or counter")
