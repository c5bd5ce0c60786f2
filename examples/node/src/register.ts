// What the example scripts share: say() and FencedRegister, a protected
// resource (not part of the client).

import type { Client } from './client';
import type { ValidateReason } from './messages';

// say prints one event line, `event key=value ...` (tests read it).
export function say(event: string, fields: Record<string, unknown> = {}): void {
  const parts = [event, ...Object.entries(fields).map(([k, v]) => `${k}=${String(v)}`)];
  process.stdout.write(parts.join(' ') + '\n');
}

export class StaleToken extends Error {
  constructor(
    readonly token: string,
    readonly reason: ValidateReason | 'BELOW_HIGH_WATER_MARK',
    readonly current: string,
  ) {
    super(`token ${token} refused: ${reason} (current token ${current})`);
    this.name = 'StaleToken';
  }
}

// FencedRegister is a protected resource holding one value. Before accepting
// a write it asks ValidateToken (the authority), and it also keeps the highest
// token it has accepted (a high-water mark) and refuses any lower one, which
// covers the gap between the check and the write.
export class FencedRegister {
  value: string | null = null;
  highWater = 0n;
  private queue: Promise<void> = Promise.resolve(); // writes one at a time

  constructor(
    private readonly client: Client,
    private readonly lockName: string,
  ) {}

  write(token: string, value: string): Promise<void> {
    const run = this.queue.then(async () => {
      const v = await this.client.validate(this.lockName, token);
      if (!v.valid) throw new StaleToken(token, v.reason, v.currentToken);
      if (BigInt(token) < this.highWater) throw new StaleToken(token, 'BELOW_HIGH_WATER_MARK', String(this.highWater));
      this.highWater = BigInt(token);
      this.value = value;
    });
    this.queue = run.catch(() => {});
    return run;
  }
}

// exit runs main and sets the exit code it resolves to.
export function exit(main: () => Promise<number>): void {
  main().then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      console.error(err);
      process.exitCode = 1;
    },
  );
}
