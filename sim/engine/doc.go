// Package engine is ration's skew simulator: it drives the real allocator
// (allocator.Ledger behind allocator.Service) and the real leased
// spender.Limiter's lease state machine (moved by the simulator through
// spender.Machine instead of the Limiter's goroutine) under virtual time
// and a simulated network, and compares enforcement strategies on identical
// traffic for one API key, or for several budgets each request is charged
// to all or nothing (a team's keys and its shared budget; input and output
// tokens: spender.Limiter.ReserveAll).
//
// One event queue orders everything (arrivals, settlements, messages,
// timeouts, maintenance ticks, membership changes) by virtual time, ties
// broken by scheduling order; one internal/fakeclock is shared by every
// spender and the allocator and moves only when the queue does. Nothing
// sleeps and no wall clock is read.
//
// The strategies are static split (standalone Limiters at limit/N),
// central (an allocator call per request, strict ledger), leased (ration,
// default and strict ledger) and sticky routing (one owner instance with
// the whole budget); see Strategy. The scenarios are listed by Scenarios.
// Run returns a Result: the admitted fraction of C + rho*t and of an
// ideal single bucket, the worst overshoot over every window length, each
// instance's admission probability and Jain's index, allocator calls per
// admission, key-grants (the key entries the allocator answered) per
// second and per active (key, gateway) pair, added latency, fallback
// admissions, stranded budget and tokens reserved against used; per
// budget (Result.Budgets), the admitted units against the ideal's and each
// budget's worst window; and the client contract: every refusal's
// Retry-After beside the ideal's exact wait for the same request at the
// same instant, the share of a client's honoured retries admitted
// (Scenario.Client), and what each gateway still holds, in its spender
// and at the allocator, a TTL after its last request.
//
// # Guarantees
//
//   - Same Config, same Result, bit for bit: traffic, the network and the
//     burst schedule draw from separate PCG streams seeded by Config.Seed,
//     so every strategy sees the same arrivals at the same instants, and
//     the strategies' own randomness never shifts the traffic.
//   - The real code decides: every admission, grant, return, expiry and
//     fallback decision is made by the spender and allocator packages; the
//     simulator only carries messages and keeps score.
//   - The overshoot is exact: the worst window is found in one pass over
//     the net charges (reserved at admission, refund at settlement) in
//     integer units of 1/period token, the period in µs (see window).
//   - Same seed, same arrivals: the traffic's requests are the same for
//     every strategy. A client that honours Retry-After
//     (Scenario.Client) sends what it was told to, so its requests, drawn
//     from a stream of their own, follow the strategy.
//   - The client contract reads a spender only as an operator would:
//     ration_spender_keys_held from its metrics, and the allocator's
//     answers to it (each holding counted until TTL after the last call
//     that touched it, as the ledger counts it).
//
// # Caveats
//
//   - A few keys per run: one, or a team's four and its budget, or input
//     and output. A spender's maintenance scan walks its keys in an order
//     that follows its Limiter's random hash seed, so a call may carry
//     them in any order; the allocator applies each key on its own, so
//     the result does not depend on it (TestSameSeedSameResult runs the
//     team scenario twice in one process, where every Limiter has its
//     own seed). More keys than fit one call (ration.MaxBatch) would make
//     the order matter.
//   - The spender's state machine is the one a gateway's Limiter runs; the
//     simulator replaces only its driver. A Reserve that finds its lease
//     short is parked until its spender's call is answered or fails, or
//     until the machine's slow-path deadline for that request passes. Wait
//     mode (ReserveAt) is not driven.
//   - Close (instances leaving, the end of a run) sends its Release straight
//     to the allocator, not over the simulated network; an instance that
//     cannot reach the allocator then just stops and its leases expire.
//   - A leased spender's lost message is noticed after the machine's own
//     attempt timeout (ten measured round trips, at least 25 ms), and the
//     machine decides when to resend; central's after Net.CallTimeout,
//     with its own backoff. A refused message (outage) is noticed after one
//     round trip.
//   - Which admissions were made under the fallback policy comes from
//     spender.AdmissionPath, cross-checked against its metrics by a test.
//   - Central fails closed after the slow-path deadline and gives up the
//     call; a grant the allocator made anyway stays held until the TTL.
//   - The allocator is in memory (no bbolt): durability is not simulated.
package engine
