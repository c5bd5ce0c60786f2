'use strict';
// A small coordinatord client for the examples, with @grpc/grpc-js and
// @grpc/proto-loader: the proto is loaded at run time, nothing is generated.
//
// Lease acquires a lock and keeps it alive with a timer (KeepAlive every
// ttl/3). FencedRegister is the protected resource: it accepts a write only if
// ValidateToken says the writer's token is the current holder's, and never
// accepts a token lower than one it already accepted.

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// The directory holding coordinator/v1/lock.proto; override with
// COORDINATORD_PROTO_ROOT when the example is copied out of the repository.
const PROTO_ROOT = process.env.COORDINATORD_PROTO_ROOT || path.join(__dirname, '..', '..', 'api');

const definition = protoLoader.loadSync('coordinator/v1/lock.proto', {
  includeDirs: [PROTO_ROOT],
  longs: String, // int64 tokens as decimal strings: compare them with BigInt
  enums: String, // reasons by name, e.g. "REASON_SUPERSEDED"
  defaults: true, // valid=false and current_token=0 are present, not omitted
});
const v1 = grpc.loadPackageDefinition(definition).coordinator.v1;

// say prints one event line, `event key=value ...` (tests read it).
function say(event, fields = {}) {
  const parts = [event, ...Object.entries(fields).map(([k, v]) => `${k}=${v}`)];
  process.stdout.write(parts.join(' ') + '\n');
}

function connect(addr) {
  return new v1.LockService(addr, grpc.credentials.createInsecure());
}

// call makes one unary call with a deadline `timeout` seconds from now.
function call(client, method, request, timeout) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + timeout * 1000 }, (err, response) => {
      if (err) reject(err);
      else resolve(response);
    });
  });
}

function duration(seconds) {
  const whole = Math.floor(seconds);
  return { seconds: String(whole), nanos: Math.round((seconds - whole) * 1e9) };
}

function seconds(d) {
  return Number(d.seconds) + d.nanos / 1e9;
}

function codeName(err) {
  return grpc.status[err.code] || String(err.code);
}

// fields yields the [field number, value] pairs of a protobuf message's
// wire bytes (varints as numbers, length-delimited values as Buffers).
function* fields(buf) {
  let i = 0;
  const varint = () => {
    let n = 0;
    let mul = 1;
    for (;;) {
      const b = buf[i++];
      n += (b & 0x7f) * mul;
      mul *= 128;
      if (!(b & 0x80)) return n;
    }
  };
  while (i < buf.length) {
    const key = varint();
    const wire = key % 8;
    let v;
    if (wire === 0) v = varint();
    else if (wire === 2) {
      const n = varint();
      v = buf.subarray(i, i + n);
      i += n;
    } else if (wire === 1) i += 8;
    else if (wire === 5) i += 4;
    else throw new Error(`unsupported wire type ${wire}`);
    yield [Math.floor(key / 8), v];
  }
}

const ERROR_INFO = 'type.googleapis.com/google.rpc.ErrorInfo';

// errorInfo is the coordinator's google.rpc.ErrorInfo of a gRPC error,
// { reason: 'LOCK_HELD', metadata: { holderToken: '7' } }, or { reason: '',
// metadata: {} } if it has none. Every coordinatord error carries one
// (api/coordinator/v1/errors.proto lists the reasons): switch on the reason,
// not on the message. It travels in the grpc-status-details-bin trailer, a
// google.rpc.Status, decoded by hand so that the example needs no
// googleapis package.
function errorInfo(err) {
  const none = { reason: '', metadata: {} };
  const raw = err && err.metadata && err.metadata.get('grpc-status-details-bin');
  for (const value of raw || []) {
    for (const [num, detail] of fields(value)) {
      if (num !== 3) continue; // Status.details: Any
      const any = new Map(fields(detail)); // type_url (1), value (2)
      if (String(any.get(1)) !== ERROR_INFO) continue;
      const info = { reason: '', domain: '', metadata: {} };
      for (const [n, v] of fields(any.get(2) || Buffer.alloc(0))) {
        if (n === 1) info.reason = String(v);
        else if (n === 2) info.domain = String(v);
        else if (n === 3) {
          const entry = new Map(fields(v)); // map entry: key (1), value (2)
          info.metadata[String(entry.get(1) || '')] = String(entry.get(2) || '');
        }
      }
      if (info.domain === 'coordinatord') return { reason: info.reason, metadata: info.metadata };
    }
  }
  return none;
}

// The reasons of a KeepAlive refusal that mean the grant is gone.
const LOST_REASONS = new Set(['NOT_HELD', 'MAX_HOLD_REACHED', 'SESSION_NOT_FOUND']);

class Lease {
  constructor(client, name, grant) {
    this.client = client;
    this.name = name;
    this.token = grant.token; // a decimal string
    this.handle = grant.handle; // the secret: never print or log it
    this.ttl = seconds(grant.ttl);
    this.lost = false;
    this.released = false;
    this.timer = null;
  }

  // acquire asks for `name`; wait === null waits until the call's deadline.
  static async acquire(client, name, { ttl, owner, wait = null, deadline = 30 }) {
    const req = { name, owner, ttl: duration(ttl) };
    if (wait !== null) req.wait = duration(wait);
    const grant = await call(client, 'Acquire', req, deadline);
    return new Lease(client, name, grant);
  }

  // keepAlive renews every ttl/3 until release() or the grant is lost.
  keepAlive() {
    let inFlight = false;
    this.timer = setInterval(async () => {
      if (inFlight) return;
      inFlight = true;
      try {
        await call(this.client, 'KeepAlive', { name: this.name, token: this.token, handle: this.handle }, this.ttl / 3);
      } catch (err) {
        if (this.released) return; // a renewal that crossed release()
        const why = errorInfo(err).reason;
        if (LOST_REASONS.has(why)) {
          // The grant is gone: whoever works under it must stop now.
          say('lost', { name: this.name, token: this.token });
          this.lost = true;
          clearInterval(this.timer);
        } else {
          // UNAVAILABLE, DEADLINE_EXCEEDED: retry at the next tick.
          say('keepalive-error', { code: codeName(err), reason: why || 'none' });
        }
      } finally {
        inFlight = false;
      }
    }, (this.ttl / 3) * 1000);
  }

  async release() {
    this.released = true;
    clearInterval(this.timer);
    const r = await call(this.client, 'Release', { name: this.name, token: this.token, handle: this.handle }, 10);
    return r.released;
  }
}

class StaleToken extends Error {
  constructor(token, reason, current) {
    super(`token ${token} refused: ${reason} (current token ${current})`);
    Object.assign(this, { token, reason, current });
  }
}

// FencedRegister is a protected resource holding one value. Before accepting a
// write it asks ValidateToken (the authority), and it also keeps the highest
// token it has accepted (a high-water mark) and refuses any lower one, which
// covers the gap between the check and the write.
class FencedRegister {
  constructor(client, lockName) {
    this.client = client;
    this.lockName = lockName;
    this.value = null;
    this.highWater = 0n;
    this.queue = Promise.resolve(); // writes one at a time
  }

  write(token, value) {
    const run = this.queue.then(async () => {
      const v = await call(this.client, 'ValidateToken', { name: this.lockName, token }, 10);
      if (!v.valid) throw new StaleToken(token, v.reason, v.currentToken);
      if (BigInt(token) < this.highWater) throw new StaleToken(token, 'BELOW_HIGH_WATER_MARK', this.highWater);
      this.highWater = BigInt(token);
      this.value = value;
    });
    this.queue = run.catch(() => {});
    return run;
  }
}

module.exports = { v1, grpc, say, connect, call, duration, codeName, errorInfo, Lease, StaleToken, FencedRegister };
