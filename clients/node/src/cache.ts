/**
 * Remembers keys fusebox reported OPEN until a deadline (on the client's
 * monotonic clock, in ms), so that guards of those keys are answered
 * blocked locally until then. Bounded: when full, ended entries go first,
 * then the one that ends soonest. Once an entry ends the next request goes
 * to the server, which admits one probe for the whole fleet.
 */
export class OpenCache {
  private readonly until = new Map<string, number>();

  constructor(readonly limit: number) {}

  /** How long key is still known OPEN at now, in ms (0: not). */
  blockedFor(key: string, now: number): number {
    const until = this.until.get(key);
    if (until === undefined) {
      return 0;
    }
    if (now >= until) {
      this.until.delete(key);
      return 0;
    }
    return until - now;
  }

  put(key: string, until: number, now: number): void {
    if (this.limit <= 0) {
      return;
    }
    if (!this.until.has(key) && this.until.size >= this.limit) {
      let victim: string | undefined;
      let soonest = Infinity;
      for (const [k, u] of this.until) {
        if (now >= u) {
          this.until.delete(k);
          continue;
        }
        if (u < soonest) {
          victim = k;
          soonest = u;
        }
      }
      if (this.until.size >= this.limit && victim !== undefined) {
        this.until.delete(victim);
      }
    }
    this.until.set(key, until);
  }

  forget(key: string): void {
    this.until.delete(key);
  }

  get size(): number {
    return this.until.size;
  }
}
