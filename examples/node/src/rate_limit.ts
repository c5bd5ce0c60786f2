// A shared rate limit over CounterService: at most LIMIT hits per WINDOW on
// one counter, whichever process or replica asks. A retried hit (same
// request_id) is answered again, never counted twice.
//
//   node examples/node/dist/rate_limit.js --addr 127.0.0.1:7070

import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import { exit, say } from './register';

const PROTO_ROOT = process.env.COORDINATORD_PROTO_ROOT || path.join(__dirname, '..', '..', '..', 'api');

// The fields of counter.proto's answers this example reads, as proto-loader
// decodes them (int64 as decimal strings, defaults present).
interface HitResponse {
  allowed: boolean;
  count: string;
  remaining: string;
  retryAfter: { seconds: string; nanos: number } | null;
  replayed: boolean;
}
interface GetResponse {
  count: string;
  limit: string;
}
interface ResetResponse {
  existed: boolean;
}

type Call<Res> = (request: object, options: grpc.CallOptions, callback: (err: grpc.ServiceError | null, response?: Res) => void) => grpc.ClientUnaryCall;
type CounterClient = grpc.Client & { Hit: Call<HitResponse>; Get: Call<GetResponse>; Reset: Call<ResetResponse> };

function counterClient(addr: string): CounterClient {
  const definition = protoLoader.loadSync('coordinator/v1/counter.proto', { includeDirs: [PROTO_ROOT], longs: String, enums: String, defaults: true });
  const pkg = grpc.loadPackageDefinition(definition) as unknown as {
    coordinator: { v1: { CounterService: new (address: string, credentials: grpc.ChannelCredentials) => CounterClient } };
  };
  return new pkg.coordinator.v1.CounterService(addr, grpc.credentials.createInsecure());
}

function call<Res>(method: Call<Res>, client: CounterClient, request: object): Promise<Res> {
  return new Promise((resolve, reject) => {
    method.call(client, request, { deadline: Date.now() + 10_000 }, (err, response) => (err ? reject(err) : resolve(response as Res)));
  });
}

async function main(): Promise<number> {
  const { values: o } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:7070' },
      name: { type: 'string', default: 'examples/rate' },
      limit: { type: 'string', default: '3' },
      window: { type: 'string', default: '60' },
      tries: { type: 'string', default: '5' },
    },
  });
  const name = o.name ?? 'examples/rate';
  const c = counterClient(o.addr ?? '127.0.0.1:7070');
  for (let n = 0; n < Number(o.tries); n++) {
    const req = { name, limit: o.limit, window: { seconds: o.window, nanos: 0 }, requestId: randomUUID() };
    const r = await call(c.Hit, c, req);
    const retry = Number(r.retryAfter?.seconds ?? 0) + (r.retryAfter?.nanos ?? 0) / 1e9;
    say('hit', { n, allowed: r.allowed, count: r.count, remaining: r.remaining, retry_after: `${retry.toFixed(3)}s` });
    if (n === 0) {
      // The answer was lost, say: the retry carries the same request_id.
      const again = await call(c.Hit, c, req);
      say('retried', { replayed: again.replayed, count: again.count });
    }
  }
  const g = await call(c.Get, c, { name });
  say('counter', { count: g.count, limit: g.limit });
  const reset = await call(c.Reset, c, { name });
  say('reset', { existed: reset.existed });
  c.close();
  return 0;
}

exit(main);
