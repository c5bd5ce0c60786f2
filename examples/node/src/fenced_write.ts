// Acquire a lock with a bounded wait (one request_id across retries), keep it
// alive with a timer, write to a fenced resource with the token, validate, and
// release. Work stops if the lease is lost or safeUntil passes.
//
//   node examples/node/dist/fenced_write.js --addr 127.0.0.1:7070
//
// --wait none asks without a wait: Acquire then waits until its deadline
// (--deadline seconds).

import { parseArgs } from 'node:util';
import { Client, CoordinatorError, Lease, LeaseLost, LockHeld } from './index';
import { FencedRegister, exit, say } from './register';

async function main(): Promise<number> {
  const { values: o } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:7070' },
      name: { type: 'string', default: 'examples/report' },
      owner: { type: 'string', default: 'node-example' },
      ttl: { type: 'string', default: '5' },
      wait: { type: 'string', default: '10' },
      deadline: { type: 'string', default: '30' },
      hold: { type: 'string', default: '0' },
    },
  });
  const name = o.name ?? 'examples/report';
  const client = new Client(o.addr ?? '127.0.0.1:7070');
  let lease: Lease;
  try {
    lease = await client.acquire(name, {
      ttl: Number(o.ttl),
      owner: o.owner,
      wait: o.wait === 'none' ? null : Number(o.wait),
      deadline: Number(o.deadline),
      onRenewError: (err) => say('keepalive-error', { code: err.codeName, reason: err.reason || 'none' }),
    });
  } catch (err) {
    if (err instanceof LockHeld) {
      // ABORTED, reason LOCK_HELD: still held after --wait.
      say('not-acquired', { name, code: err.codeName, reason: err.reason, holder: err.holderToken });
      return 2;
    }
    if (err instanceof CoordinatorError) {
      // DEADLINE_EXCEEDED: --deadline came first; anything else by reason.
      say('not-acquired', { name, code: err.codeName, reason: err.reason || 'none', holder: 'none' });
      return 2;
    }
    throw err;
  }
  say('acquired', { name, token: lease.token, ttl: `${lease.ttl}s` });

  try {
    lease.check();
    const register = new FencedRegister(client, name);
    await register.write(lease.token, `report by ${o.owner}`);
    say('wrote', { token: lease.token });

    if (o.hold === 'stdin') {
      process.stdin.resume();
      await new Promise((resolve) => process.stdin.on('end', resolve));
    } else {
      await new Promise((resolve) => setTimeout(resolve, Number(o.hold) * 1000));
    }

    lease.check();
    const v = await client.validate(name, lease.token);
    say('validated', { token: lease.token, valid: v.valid, reason: v.reason, current: v.currentToken });
    lease.check();
    await register.write(lease.token, `report by ${o.owner}, final`);
    say('wrote', { token: lease.token });
  } catch (err) {
    if (!(err instanceof LeaseLost)) throw err;
    say('stopped', { reason: err.reason });
    await lease.release().catch(() => false);
    client.close();
    return 3;
  }
  say('released', { token: lease.token, released: await lease.release() });
  client.close();
  return 0;
}

exit(main);
