// The messages of api/coordinator/v1/lock.proto this client uses, as
// @grpc/proto-loader decodes them with the options in coord.ts (int64 as
// decimal strings, enums by name, defaults present, lowerCamel field names).

export interface Duration {
  seconds: string;
  nanos: number;
}

export interface Timestamp {
  seconds: string;
  nanos: number;
}

export interface AcquireRequest {
  name: string;
  ttl?: Duration;
  wait?: Duration;
  owner?: string;
  requestId?: string;
  limit?: number; // a counting semaphore of that many holders
  mode?: string; // 'LOCK_MODE_SHARED': a read-write lock's reader
}

export interface AcquireResponse {
  token: string;
  handle: string;
  leaseId: string;
  ttl: Duration;
  expiresAt: Timestamp | null;
  safeUntil: Timestamp | null;
  acquiredAt: Timestamp | null;
  resumed: boolean;
  slot: number; // a semaphore's permit
  mode: string;
}

export interface GrantRequest {
  name: string;
  token: string;
  handle: string;
}

export interface ReleaseResponse {
  released: boolean;
}

export interface KeepAliveResponse {
  ttl: Duration;
  expiresAt: Timestamp | null;
  safeUntil: Timestamp | null;
}

export interface ValidateTokenRequest {
  name: string;
  token: string;
}

export type ValidateReason = 'REASON_UNSPECIFIED' | 'REASON_CURRENT' | 'REASON_SUPERSEDED' | 'REASON_NOT_HELD';

export interface ValidateTokenResponse {
  valid: boolean;
  reason: ValidateReason;
  currentToken: string;
}

export interface Waiter {
  owner: string;
  waitingSince: Timestamp | null;
}

export interface DescribeResponse {
  holder: { name: string; token: string; owner: string } | null;
  waiters: Waiter[];
}
