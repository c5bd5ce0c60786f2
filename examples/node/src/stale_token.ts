// What happens to a stale token: holder A stops renewing (think of a long GC
// pause), its lease expires, B gets the lock with a greater token, and A's late
// write is refused by the fenced resource (ValidateToken: REASON_SUPERSEDED).
// A's own check() would have stopped it: its safeUntil passed unrenewed.
//
//   node examples/node/dist/stale_token.js --addr 127.0.0.1:7070

import { parseArgs } from 'node:util';
import { Client, CoordinatorError } from './index';
import { FencedRegister, StaleToken, exit, say } from './register';

async function main(): Promise<number> {
  const { values: o } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:7070' },
      name: { type: 'string', default: 'examples/stale' },
    },
  });
  const name = o.name ?? 'examples/stale';
  const client = new Client(o.addr ?? '127.0.0.1:7070');
  const register = new FencedRegister(client, name);

  // A takes the lock with the shortest TTL etcd grants and, paused, never renews it.
  const a = await client.acquire(name, { ttl: 2, owner: 'node-a', wait: 10, keepAlive: false });
  say('acquired', { who: 'a', token: a.token, ttl: `${a.ttl}s` });
  await register.write(a.token, 'from a');
  say('wrote', { who: 'a', token: a.token });
  say('paused', { who: 'a' });

  // B waits in the queue and is granted once A's lease expires.
  const b = await client.acquire(name, { ttl: 10, owner: 'node-b', wait: 20 });
  say('acquired', { who: 'b', token: b.token, ttl: `${b.ttl}s` });
  await register.write(b.token, 'from b');
  say('wrote', { who: 'b', token: b.token });

  // A wakes up. Its token is no longer the current holder's...
  const v = await client.validate(name, a.token);
  say('validated', { who: 'a', token: a.token, valid: v.valid, reason: v.reason, current: v.currentToken });
  // ...so the resource refuses its late write (A's a.check() would throw
  // LeaseLost SAFE_UNTIL_PASSED: a careful A never gets this far).
  try {
    await register.write(a.token, 'late write from a');
    say('accepted', { who: 'a', token: a.token }); // never happens
    return 1;
  } catch (err) {
    if (!(err instanceof StaleToken)) throw err;
    say('refused', { who: 'a', token: err.token, reason: err.reason, current: err.current });
  }

  // A's renewal fails and its handle cannot release B's grant.
  try {
    await a.renew(10);
    say('renewed', { who: 'a' }); // never happens
    return 1;
  } catch (err) {
    if (!(err instanceof CoordinatorError)) throw err;
    say('keepalive', { who: 'a', code: err.codeName, reason: err.reason || 'none' });
  }
  say('released', { who: 'a', released: await a.release() });
  say('released', { who: 'b', released: await b.release() });
  say('register', { value: JSON.stringify(register.value), high_water: register.highWater });
  client.close();
  return 0;
}

exit(main);
