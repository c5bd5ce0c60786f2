// coordinatord: a typed Node.js client of the coordinatord lock and fencing
// service.
//
//   const client = new Client('127.0.0.1:7070');
//   const lease = await client.acquire('jobs/report', { ttl: 10, wait: 30 });
//   try {
//     for (const item of work) {
//       lease.check(); // throws LeaseLost once safeUntil passes unrenewed
//       await write(item, { fencingToken: lease.token, signal: lease.signal });
//     }
//   } finally {
//     await lease.release();
//   }

export { Client, Lease, margin, duration, seconds } from './client';
export type { AcquireOptions, Call, Methods } from './client';
export { CoordinatorError, LockHeld, LeaseLost, errorInfo, LOST_REASONS, RETRYABLE_CODES, DOMAIN } from './errors';
export type { ErrorInfo } from './errors';
export type * from './messages';
