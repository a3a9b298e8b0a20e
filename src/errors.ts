/**
 * A refusal the user can act on: bad input, a failed guard, a plan that cannot run.
 * The message names the value, the rule (SPEC id) and what to do instead. `main` prints it
 * without a stack trace and exits 2; anything else is a bug and keeps its stack.
 */
export class UserError extends Error {
  readonly rule: string;
  constructor(rule: string, message: string) {
    super(`${message} [${rule}]`);
    this.name = "UserError";
    this.rule = rule;
  }
}

/** True for a UserError, also one that crossed a thread as a plain object (name survives). */
export function isUserError(e: unknown): e is { name: string; message: string; rule?: string } {
  return typeof e === "object" && e !== null && (e as { name?: unknown }).name === "UserError";
}
