'use strict';
// What happens to a stale token: holder A stops renewing (think of a long GC
// pause), its lease expires, B gets the lock with a greater token, and A's late
// write is refused by the fenced resource (ValidateToken: REASON_SUPERSEDED).
//
//   node examples/node/stale_token.js --addr 127.0.0.1:7070

const { parseArgs } = require('node:util');
const coord = require('./coord');

async function main() {
  const { values: o } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:7070' },
      name: { type: 'string', default: 'examples/stale' },
    },
  });
  const client = coord.connect(o.addr);
  const register = new coord.FencedRegister(client, o.name);

  // A takes the lock with the shortest TTL etcd grants and, paused, never renews it.
  const a = await coord.Lease.acquire(client, o.name, { ttl: 2, owner: 'node-a', wait: 10 });
  coord.say('acquired', { who: 'a', token: a.token, ttl: `${a.ttl}s` });
  await register.write(a.token, 'from a');
  coord.say('wrote', { who: 'a', token: a.token });
  coord.say('paused', { who: 'a' });

  // B waits in the queue and is granted once A's lease expires.
  const b = await coord.Lease.acquire(client, o.name, { ttl: 10, owner: 'node-b', wait: 20 });
  coord.say('acquired', { who: 'b', token: b.token, ttl: `${b.ttl}s` });
  b.keepAlive();
  await register.write(b.token, 'from b');
  coord.say('wrote', { who: 'b', token: b.token });

  // A wakes up. Its token is no longer the current holder's...
  const v = await coord.call(client, 'ValidateToken', { name: o.name, token: a.token }, 10);
  coord.say('validated', { who: 'a', token: a.token, valid: v.valid, reason: v.reason, current: v.currentToken });
  // ...so the resource refuses its late write.
  try {
    await register.write(a.token, 'late write from a');
    coord.say('accepted', { who: 'a', token: a.token }); // never happens
    return 1;
  } catch (err) {
    if (!(err instanceof coord.StaleToken)) throw err;
    coord.say('refused', { who: 'a', token: err.token, reason: err.reason, current: err.current });
  }

  // A's renewal fails and its handle cannot release B's grant.
  try {
    await coord.call(client, 'KeepAlive', { name: o.name, token: a.token, handle: a.handle }, 10);
    coord.say('renewed', { who: 'a' }); // never happens
    return 1;
  } catch (err) {
    coord.say('keepalive', { who: 'a', code: coord.codeName(err), reason: coord.errorInfo(err).reason || 'none' });
  }
  coord.say('released', { who: 'a', released: await a.release() });
  coord.say('released', { who: 'b', released: await b.release() });
  coord.say('register', { value: JSON.stringify(register.value), high_water: register.highWater });
  client.close();
  return 0;
}

main().then(
  (code) => { process.exitCode = code; },
  (err) => { console.error(err); process.exitCode = 1; },
);
