// The coordinator's errors, by reason. Every coordinatord error carries a
// google.rpc.ErrorInfo (domain "coordinatord") whose reason is an ErrorReason
// of errors.proto without its ERROR_REASON_ prefix, e.g. LOCK_HELD, with
// lowerCamel metadata keys, e.g. holderToken. Switch on the reason, never on
// the message. The ErrorInfo travels in the grpc-status-details-bin trailer,
// a google.rpc.Status, decoded by hand here so that no googleapis package is
// needed.

import { Metadata, ServiceError, status } from '@grpc/grpc-js';

export const DOMAIN = 'coordinatord';

// The reasons of a KeepAlive refusal that mean the grant is gone for good.
export const LOST_REASONS: ReadonlySet<string> = new Set(['NOT_HELD', 'MAX_HOLD_REACHED', 'SESSION_NOT_FOUND']);

// The codes after which the outcome of a call is unknown: retry it, with the
// same request_id for an Acquire.
export const RETRYABLE_CODES: ReadonlySet<status> = new Set([status.UNAVAILABLE, status.DEADLINE_EXCEEDED]);

export interface ErrorInfo {
  reason: string; // '' when the error came from the transport, not the server
  metadata: Record<string, string>;
}

// fields yields the [field number, value] pairs of a protobuf message's wire
// bytes (varints as numbers, length-delimited values as Buffers).
function* fields(buf: Buffer): Generator<[number, number | Buffer]> {
  let i = 0;
  const varint = (): number => {
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
    let v: number | Buffer = 0;
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

function bytesOf(m: Map<number, number | Buffer>, n: number): Buffer {
  const v = m.get(n);
  return Buffer.isBuffer(v) ? v : Buffer.alloc(0);
}

// errorInfo is the coordinator's ErrorInfo in a gRPC error's trailers.
export function errorInfo(metadata: Metadata | undefined): ErrorInfo {
  for (const value of metadata?.get('grpc-status-details-bin') ?? []) {
    if (!Buffer.isBuffer(value)) continue;
    for (const [num, detail] of fields(value)) {
      if (num !== 3 || !Buffer.isBuffer(detail)) continue; // Status.details: Any
      const any = new Map(fields(detail)); // type_url (1), value (2)
      if (bytesOf(any, 1).toString() !== ERROR_INFO) continue;
      let reason = '';
      let domain = '';
      const md: Record<string, string> = {};
      for (const [n, v] of fields(bytesOf(any, 2))) {
        if (!Buffer.isBuffer(v)) continue;
        if (n === 1) reason = v.toString();
        else if (n === 2) domain = v.toString();
        else if (n === 3) {
          const entry = new Map(fields(v)); // map entry: key (1), value (2)
          md[bytesOf(entry, 1).toString()] = bytesOf(entry, 2).toString();
        }
      }
      if (domain === DOMAIN) return { reason, metadata: md };
    }
  }
  return { reason: '', metadata: {} };
}

// CoordinatorError is a refused call: the gRPC code, the ErrorInfo reason and
// its metadata. The ServiceError is `cause`.
export class CoordinatorError extends Error {
  readonly code: status;
  readonly reason: string;
  readonly metadata: Record<string, string>;

  constructor(code: status, info: ErrorInfo, message: string, cause?: unknown) {
    super(`${status[code]} ${info.reason || '(no reason)'}: ${message}`, { cause });
    this.name = 'CoordinatorError';
    this.code = code;
    this.reason = info.reason;
    this.metadata = info.metadata;
  }

  // codeName is the code's name, e.g. "NOT_FOUND".
  get codeName(): string {
    return status[this.code] ?? String(this.code);
  }
}

// LockHeld: Acquire was not granted within its wait (ABORTED, LOCK_HELD).
export class LockHeld extends CoordinatorError {
  constructor(code: status, info: ErrorInfo, message: string, cause?: unknown) {
    super(code, info, message, cause);
    this.name = 'LockHeld';
  }

  // holderToken is the current holder's fencing token ('0' if not sent).
  get holderToken(): string {
    return this.metadata.holderToken || '0';
  }
}

// LeaseLost: the lease can no longer be trusted; stop working under its
// token. reason is the server's (NOT_HELD, MAX_HOLD_REACHED,
// SESSION_NOT_FOUND), SAFE_UNTIL_PASSED when no renewal was confirmed in
// time, or RELEASED after release().
export class LeaseLost extends Error {
  constructor(
    readonly lockName: string,
    readonly token: string,
    readonly reason: string,
  ) {
    super(`lease of ${JSON.stringify(lockName)} (token ${token}) lost: ${reason}`);
    this.name = 'LeaseLost';
  }
}

function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === 'number';
}

// wrap turns a gRPC error into a CoordinatorError (LockHeld for LOCK_HELD);
// anything else is returned as it is.
export function wrap(err: unknown): unknown {
  if (!isServiceError(err)) return err;
  const info = errorInfo(err.metadata);
  const Kind = info.reason === 'LOCK_HELD' ? LockHeld : CoordinatorError;
  return new Kind(err.code, info, err.details || err.message, err);
}
