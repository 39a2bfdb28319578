package allocator

import (
	"sync"
	"time"
)

// groupCommit is the leader/follower group commit that both durable paths
// of a Ledger share: the journal (store.go), where a commit is one bbolt
// transaction, and the cluster (replicated.go), where it is one raft log
// entry. Calls queue their work with the path, which numbers it (positions
// 1, 2, ...), then wait for their position.
//
// At most one commit is in flight. A caller that finds one running waits
// for it, and if that commit did not cover its position, the first waiter
// to wake commits everything queued so far on behalf of all of them. So
// the calls that arrive during one commit share the next. Under
// concurrent load the committer first lingers (see lingerFor) so that
// more calls join.
type groupCommit struct {
	linger time.Duration       // the longest a commit lingers; 0: never
	sleep  func(time.Duration) // time.Sleep; tests replace it

	// flush commits everything queued and returns the last position it
	// covered (what was queued when it took the queue). It runs on one
	// goroutine at a time. On error, nothing it took counts as committed:
	// the path keeps it for the next flush, the caller that flushed gets
	// the error, and the others waiting try a flush of their own.
	flush func() (end uint64, err error)

	mu         sync.Mutex
	cond       *sync.Cond // on mu: a commit finished
	done       uint64     // positions committed so far
	committing bool       // a flush is in flight
	arrived    int        // calls that waited since the last commit began
	lastBatch  int        // calls that waited during the previous commit cycle
}

func newGroupCommit(linger time.Duration, flush func() (uint64, error)) *groupCommit {
	g := &groupCommit{linger: linger, sleep: time.Sleep, flush: flush}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait returns once every position up to target is committed, or with
// the error of a flush this call ran. A flush may cover less than was
// queued (the cluster path bounds an entry), so the caller that flushed
// goes on until its own position is covered. A commit cannot be abandoned
// halfway, so there is no context.
func (g *groupCommit) wait(target uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.arrived++
	for {
		for g.done < target && g.committing {
			g.cond.Wait()
		}
		if g.done >= target {
			return nil
		}
		g.committing = true
		last := g.lastBatch
		g.mu.Unlock()

		// Under concurrent load, linger so that more calls share the
		// commit; a lone caller commits at once.
		if g.linger > 0 && last > 1 {
			g.lingerFor(g.linger, last)
		}
		g.mu.Lock()
		g.lastBatch, g.arrived = g.arrived, 0
		g.mu.Unlock()

		end, err := g.flush()

		g.mu.Lock()
		g.committing = false
		if err == nil {
			g.done = max(g.done, end)
		}
		g.cond.Broadcast()
		if err != nil {
			return err
		}
	}
}

// lingerStep is the step of a commit's linger.
const lingerStep = time.Millisecond

// lingerCalls is the batch that ends a linger early: shared by this many
// calls, a commit's fsyncs cost a few µs per call, so waiting longer would
// add latency for little gain.
const lingerCalls = 64

// sustainedBatch is the number of calls in a commit cycle from which the
// next linger counts the load as sustained (see lingerFor).
const sustainedBatch = lingerCalls / 4

// lingerFor waits for more calls to join the next commit, in steps of
// lingerStep, until lingerCalls calls wait for it, at most max in all; last
// is the number of calls in the previous commit cycle. After a light cycle
// (last below sustainedBatch) a step without a call ends it, so a sparse
// caller waits one step at most. After a sustained one a quiet step ends
// it only once as many calls wait as last time: under load calls arrive in
// bursts (a commit releases its batch at once), so a quiet millisecond says
// little, but once every caller of a small closed population waits, no
// call is coming.
func (g *groupCommit) lingerFor(max time.Duration, last int) {
	for waited := time.Duration(0); waited < max; waited += lingerStep {
		g.mu.Lock()
		before := g.arrived
		g.mu.Unlock()
		if before >= lingerCalls {
			return
		}
		g.sleep(min(lingerStep, max-waited))
		g.mu.Lock()
		now := g.arrived
		g.mu.Unlock()
		if now == before && (last < sustainedBatch || now >= last) {
			return
		}
	}
}
