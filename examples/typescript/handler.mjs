// A handler for the TypeScript SDK's command line, which does the claiming,
// leases, outcomes and Ctrl-C for it:
//
//     npx child-ledger-worker examples/typescript/handler.mjs --queue events
//
// Its return value is the child's result (processed); throw Failed(reason)
// to record it failed; any other error gives it back for another attempt.
import { Failed } from "child-ledger";

export default async function handle(child) {
  if (!child.payload.customer) throw new Failed("no customer id");
  return { charged: `ch-${child.idempotency_key}` };
}
