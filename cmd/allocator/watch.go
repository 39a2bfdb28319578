package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/rationhq/ration/allocator/cluster"
)

// errRemoved is run's error when this member learned that it was removed
// from its cluster: main exits with exitRemoved.
var errRemoved = errors.New("allocator: this member was removed from the cluster, so it stopped; " +
	"it would not rejoin if restarted (to add it again, empty its -data-dir, start it without -cluster-bootstrap and run 'allocator cluster add')")

// watchInterval is how often a member checks its readiness.
const watchInterval = 100 * time.Millisecond

// startWatch runs watchMember on node until stop is called: removed
// delivers errRemoved if the member learns that it was removed.
func startWatch(node *cluster.Node, log *slog.Logger) (removed <-chan error, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		if err := watchMember(ctx, node, log); err != nil {
			ch <- err
		}
	}()
	return ch, func() { cancel(); <-done }
}

// watchMember logs when the member becomes ready (it leads, or follows a
// leader it has caught up with) and when it stops being ready, with the
// reason, until ctx ends. It returns errRemoved as soon as the member
// learns that it was removed from the cluster, nil when ctx ends.
func watchMember(ctx context.Context, node *cluster.Node, log *slog.Logger) error {
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	ready := false
	for {
		err := node.Ready()
		switch {
		case errors.Is(err, cluster.ErrRemoved):
			log.Warn("allocator: this member was removed from the cluster; stopping", "id", string(node.ID()))
			return errRemoved
		case err == nil && !ready:
			role := "follower"
			if node.IsLeader() {
				role = "leader"
			}
			_, leader := node.Leader()
			log.Info("allocator: ready", "role", role, "leader", string(leader))
		case err != nil && ready:
			log.Warn("allocator: not ready", "reason", err.Error())
		}
		ready = err == nil
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
