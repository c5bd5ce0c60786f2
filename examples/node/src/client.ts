// Client and Lease: acquire a lock safely, keep it alive, stop at safe_until.
//
// The safety model is the Go SDK's (client/client.go):
//
//   - One request_id per logical acquisition, sent again on every retry of an
//     ambiguous outcome (UNAVAILABLE, DEADLINE_EXCEEDED): the server answers a
//     retry with the same grant or the same queue position, never a second one.
//   - A local deadline, safeUntil = (monotonic time just before the request
//     that granted or renewed the lease was sent) + TTL - margin, with margin
//     max(TTL/10, 500ms), at most TTL/2, from this process's monotonic clock
//     (performance.now()) only, so it holds whatever the server's clock says.
//   - A timer renews every third of (TTL - margin). When the server says the
//     grant is gone (NOT_HELD, MAX_HOLD_REACHED, SESSION_NOT_FOUND), or
//     safeUntil passes without a confirmed renewal, the lease is lost:
//     lease.lost is true, lease.signal aborts and lease.check() throws
//     LeaseLost. Work under the token must stop then.

import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import { CoordinatorError, LOST_REASONS, LeaseLost, RETRYABLE_CODES, wrap } from './errors';
import type {
  AcquireRequest,
  AcquireResponse,
  DescribeResponse,
  Duration,
  GrantRequest,
  KeepAliveResponse,
  ReleaseResponse,
  ValidateTokenRequest,
  ValidateTokenResponse,
} from './messages';

// The directory holding coordinator/v1/lock.proto (the repository's api/,
// from dist/); override with COORDINATORD_PROTO_ROOT when the client is
// copied out of the repository.
const PROTO_ROOT = process.env.COORDINATORD_PROTO_ROOT || path.join(__dirname, '..', '..', '..', 'api');

// The unary methods and their [request, response] types.
export interface Methods {
  Acquire: [AcquireRequest, AcquireResponse];
  Release: [GrantRequest, ReleaseResponse];
  KeepAlive: [GrantRequest, KeepAliveResponse];
  ValidateToken: [ValidateTokenRequest, ValidateTokenResponse];
  Describe: [{ name: string }, DescribeResponse];
}

// Call makes one unary call with a deadline timeoutSeconds from now; it
// rejects with the grpc-js ServiceError.
export type Call = <M extends keyof Methods>(method: M, request: Methods[M][0], timeoutSeconds: number) => Promise<Methods[M][1]>;

type Unary = (request: unknown, options: grpc.CallOptions, callback: (err: grpc.ServiceError | null, response?: unknown) => void) => grpc.ClientUnaryCall;
type LockServiceClient = grpc.Client & Record<keyof Methods, Unary>;
type LockServiceConstructor = new (address: string, credentials: grpc.ChannelCredentials) => LockServiceClient;

let lockService: LockServiceConstructor | undefined;

function loadLockService(): LockServiceConstructor {
  if (!lockService) {
    const definition = protoLoader.loadSync('coordinator/v1/lock.proto', {
      includeDirs: [PROTO_ROOT],
      longs: String, // int64 tokens as decimal strings: compare them with BigInt
      enums: String, // reasons by name, e.g. "REASON_SUPERSEDED"
      defaults: true, // valid=false and current_token=0 are present, not omitted
    });
    const pkg = grpc.loadPackageDefinition(definition) as unknown as { coordinator: { v1: { LockService: LockServiceConstructor } } };
    lockService = pkg.coordinator.v1.LockService;
  }
  return lockService;
}

export function duration(seconds: number): Duration {
  const whole = Math.floor(seconds);
  return { seconds: String(whole), nanos: Math.round((seconds - whole) * 1e9) };
}

export function seconds(d: Duration | null | undefined): number {
  return d ? Number(d.seconds) + d.nanos / 1e9 : 0;
}

// margin is the safety margin subtracted from the TTL (seconds):
// max(ttl/10, 0.5s), at most ttl/2.
export function margin(ttl: number): number {
  return Math.min(Math.max(ttl / 10, 0.5), ttl / 2);
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export interface AcquireOptions {
  ttl: number; // seconds
  owner?: string;
  // Seconds to wait in the queue (0: try-lock); null waits until the deadline.
  wait?: number | null;
  // Seconds for the whole acquisition, retries included (default 30).
  deadline?: number;
  // Seconds per attempt (default: what is left of the deadline).
  attemptTimeout?: number;
  // The idempotency key (default: a random UUID), the same on every retry.
  requestId?: string;
  // Renew in the background (default true).
  keepAlive?: boolean;
  // Called with each renewal error that will be retried.
  onRenewError?: (err: CoordinatorError) => void;
  // First retry pause, seconds (default 0.1), doubled up to 2s, ±20% jitter.
  backoff?: number;
  // A counting semaphore of this many holders (every acquisition of the name
  // must ask for the same); the Lease's slot says which permit it holds.
  limit?: number;
  // A read-write lock's reader (default: a writer).
  shared?: boolean;
}

export class Client {
  readonly grpcClient: LockServiceClient;
  // The transport of every call; replaceable (tests inject failures here).
  call: Call;

  constructor(target: string, credentials: grpc.ChannelCredentials = grpc.credentials.createInsecure()) {
    const LockService = loadLockService();
    this.grpcClient = new LockService(target, credentials);
    this.call = <M extends keyof Methods>(method: M, request: Methods[M][0], timeoutSeconds: number) =>
      new Promise<Methods[M][1]>((resolve, reject) => {
        this.grpcClient[method](request, { deadline: Date.now() + timeoutSeconds * 1000 }, (err, response) => {
          if (err) reject(err);
          else resolve(response as Methods[M][1]);
        });
      });
  }

  close(): void {
    this.grpcClient.close();
  }

  // acquire asks for the lock `name` and resolves to its Lease, renewed in the
  // background unless keepAlive is false. UNAVAILABLE and DEADLINE_EXCEEDED
  // are retried with the same request_id while the deadline allows. Rejects
  // with LockHeld (holderToken) when not granted within `wait`, with
  // CoordinatorError otherwise.
  async acquire(name: string, o: AcquireOptions): Promise<Lease> {
    const req: AcquireRequest = { name, owner: o.owner ?? '', ttl: duration(o.ttl), requestId: o.requestId ?? randomUUID(), limit: o.limit ?? 0 };
    if (o.shared) req.mode = 'LOCK_MODE_SHARED';
    if (o.wait !== undefined && o.wait !== null) req.wait = duration(o.wait);
    const first = performance.now();
    const end = first + (o.deadline ?? 30) * 1000;
    let delay = (o.backoff ?? 0.1) * 1000;
    let attempts = 0;
    let grant: AcquireResponse;
    for (;;) {
      attempts++;
      const left = (end - performance.now()) / 1000;
      const timeout = o.attemptTimeout === undefined ? left : Math.min(left, o.attemptTimeout);
      try {
        grant = await this.call('Acquire', req, Math.max(timeout, 0.001));
        break;
      } catch (raw) {
        const err = wrap(raw);
        const pause = delay * (0.8 + Math.random() * 0.4);
        if (!(err instanceof CoordinatorError) || !RETRYABLE_CODES.has(err.code) || end - performance.now() <= pause) throw err;
        await sleep(pause);
        delay = Math.min(delay * 2, 2000);
      }
    }
    const lease = new Lease(this, name, grant, first, req.requestId ?? '', attempts, o.onRenewError);
    // After a long wait or retries the bound from the first send may be
    // near: confirm the grant with a renewal before handing it out.
    if (performance.now() - first > lease.interval * 1000) {
      try {
        await lease.renew();
      } catch (err) {
        await lease.release().catch(() => false);
        throw err;
      }
    }
    if (o.keepAlive ?? true) lease.start();
    return lease;
  }

  // validate asks ValidateToken whether token is the current holder's.
  async validate(name: string, token: string): Promise<ValidateTokenResponse> {
    try {
      return await this.call('ValidateToken', { name, token }, 10);
    } catch (err) {
      throw wrap(err);
    }
  }
}

// Lease is a granted lock. Call check() before each piece of work done under
// its token, or pass signal to the work; release() when done.
export class Lease {
  readonly token: string; // a decimal string: compare with BigInt
  readonly handle: string; // the secret: never print or log it
  readonly ttl: number; // seconds
  readonly resumed: boolean; // a retry got the grant an earlier attempt made
  readonly slot: number; // a semaphore's permit: tokens rise per slot
  readonly margin: number;
  readonly interval: number; // seconds between renewals
  lostReason = '';
  private safeUntilMs: number;
  private readonly controller = new AbortController();
  private renewTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    readonly client: Client,
    readonly name: string,
    grant: AcquireResponse,
    sentMs: number,
    readonly requestId: string,
    readonly attempts: number,
    private readonly onRenewError?: (err: CoordinatorError) => void,
  ) {
    this.token = grant.token;
    this.handle = grant.handle;
    this.ttl = seconds(grant.ttl);
    this.resumed = grant.resumed;
    this.slot = grant.slot;
    this.margin = margin(this.ttl);
    this.interval = (this.ttl - this.margin) / 3;
    this.safeUntilMs = sentMs + (this.ttl - this.margin) * 1000;
    this.armDeadline();
  }

  // signal aborts (with a LeaseLost reason) once the lease is lost.
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get lost(): boolean {
    return this.controller.signal.aborted;
  }

  // safeUntil is the performance.now() value until which the lease is known to be held.
  get safeUntil(): number {
    return this.safeUntilMs;
  }

  // remaining is the number of seconds left before safeUntil (negative once passed).
  remaining(): number {
    return (this.safeUntilMs - performance.now()) / 1000;
  }

  // check throws LeaseLost unless the lease is still safe to work under.
  check(): void {
    if (!this.lost && this.remaining() <= 0) this.lose('SAFE_UNTIL_PASSED');
    if (this.lost) throw this.controller.signal.reason;
  }

  private lose(reason: string): void {
    if (this.lost) return;
    this.lostReason = reason;
    clearTimeout(this.deadlineTimer);
    this.controller.abort(new LeaseLost(this.name, this.token, reason));
  }

  // armDeadline (re)sets the timer that declares the lease lost at safeUntil.
  // Unref'd: it alone does not keep the process running.
  private armDeadline(): void {
    clearTimeout(this.deadlineTimer);
    if (this.lost) return;
    this.deadlineTimer = setTimeout(() => {
      if (this.remaining() <= 0) this.lose('SAFE_UNTIL_PASSED');
      else this.armDeadline();
    }, Math.max(this.remaining() * 1000, 0));
    this.deadlineTimer.unref();
  }

  // renew makes one KeepAlive (timeout seconds, default the interval) and
  // moves safeUntil forward. Rejects with CoordinatorError; a reason in
  // LOST_REASONS also marks the lease lost.
  async renew(timeout = this.interval): Promise<void> {
    const sent = performance.now();
    let r: KeepAliveResponse;
    try {
      r = await this.client.call('KeepAlive', { name: this.name, token: this.token, handle: this.handle }, timeout);
    } catch (raw) {
      const err = wrap(raw);
      if (err instanceof CoordinatorError && LOST_REASONS.has(err.reason)) this.lose(err.reason);
      throw err;
    }
    const ttl = seconds(r.ttl);
    this.safeUntilMs = Math.max(this.safeUntilMs, sent + (ttl - margin(ttl)) * 1000);
    this.armDeadline();
  }

  // start renews every interval until release(), stop() or loss.
  start(): void {
    const tick = async () => {
      if (this.stopped || this.lost) return;
      try {
        // A renewal answered after safeUntil is of no use.
        await this.renew(Math.max(Math.min(this.interval, this.remaining()), 0.05));
      } catch (err) {
        if (this.stopped || this.lost) return;
        if (err instanceof CoordinatorError) this.onRenewError?.(err);
      }
      if (!this.stopped && !this.lost) this.renewTimer = setTimeout(tick, Math.max(Math.min(this.interval, this.remaining()), 0) * 1000);
    };
    this.renewTimer = setTimeout(tick, this.interval * 1000);
  }

  // stop stops renewing (the lease then ends at its TTL).
  stop(): void {
    this.stopped = true;
    clearTimeout(this.renewTimer);
  }

  // release stops renewing and gives the grant up: true if this call freed
  // the lock, false if it had already ended.
  async release(): Promise<boolean> {
    this.stop();
    this.lose('RELEASED');
    try {
      const r = await this.client.call('Release', { name: this.name, token: this.token, handle: this.handle }, 10);
      return r.released;
    } catch (err) {
      throw wrap(err);
    }
  }
}
