'use strict';
// Acquire a lock with a bounded wait, keep it alive with a timer, write to a
// fenced resource with the token, validate, and release.
//
//   node examples/node/fenced_write.js --addr 127.0.0.1:7070
//
// --wait none asks without a wait: Acquire then waits until its deadline
// (--deadline seconds).

const { parseArgs } = require('node:util');
const coord = require('./coord');

async function main() {
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
  const client = coord.connect(o.addr);
  let lease;
  try {
    lease = await coord.Lease.acquire(client, o.name, {
      ttl: Number(o.ttl),
      owner: o.owner,
      wait: o.wait === 'none' ? null : Number(o.wait),
      deadline: Number(o.deadline),
    });
  } catch (err) {
    // ABORTED, reason LOCK_HELD: still held after --wait (the holder's token
    // is in the ErrorInfo's metadata); DEADLINE_EXCEEDED: --deadline came first.
    const { reason, metadata } = coord.errorInfo(err);
    coord.say('not-acquired', { name: o.name, code: coord.codeName(err), reason: reason || 'none', holder: metadata.holderToken || 'none' });
    return 2;
  }
  coord.say('acquired', { name: o.name, token: lease.token, ttl: `${lease.ttl}s` });
  lease.keepAlive();

  const register = new coord.FencedRegister(client, o.name);
  await register.write(lease.token, `report by ${o.owner}`);
  coord.say('wrote', { token: lease.token });

  if (o.hold === 'stdin') {
    process.stdin.resume();
    await new Promise((resolve) => process.stdin.on('end', resolve));
  } else {
    await new Promise((resolve) => setTimeout(resolve, Number(o.hold) * 1000));
  }
  if (lease.lost) {
    coord.say('stopped', { reason: 'lease lost' });
    return 3;
  }

  const v = await coord.call(client, 'ValidateToken', { name: o.name, token: lease.token }, 10);
  coord.say('validated', { token: lease.token, valid: v.valid, reason: v.reason, current: v.currentToken });
  await register.write(lease.token, `report by ${o.owner}, final`);
  coord.say('wrote', { token: lease.token });

  coord.say('released', { token: lease.token, released: await lease.release() });
  client.close();
  return 0;
}

main().then(
  (code) => { process.exitCode = code; },
  (err) => { console.error(err); process.exitCode = 1; },
);
