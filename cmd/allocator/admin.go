package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/cluster"
)

// The admin API of a cluster member, on its lease API listener, behind
// the admin tokens (docs/cluster.md, "Operations"; docs/security.md):
//
//	GET    /admin/cluster               the members as this member knows them (any member)
//	POST   /admin/cluster/members       add a member: {"id": "d", "raft_address": "host:port"}
//	DELETE /admin/cluster/members/{id}  remove a member
//	GET    /admin/backup                the leader's applied state (application/octet-stream)
//	POST   /admin/restore               replace the cluster's state with a backup (the body)
//
// All but the first run on the leader: a follower answers 307 with the
// leader's URL when it knows one, 503 otherwise. A change refused for
// what it would do to the cluster is 409 with the reason.

// minRestoreBytes is the least a restore's body may be; the most is twice
// the cluster's state (a backup of it), if larger, up to
// cluster.MaxSnapshotBytes. A backup declaring more is refused from its
// header, so a restore holds at most that in memory, and a new cluster
// takes a backup of a few million keys.
const minRestoreBytes = 256 << 20

// adminTimeout bounds a membership change (a new member's catch-up
// included) or a restore.
const adminTimeout = 30 * time.Second

// memberInfo is one member in GET /admin/cluster.
type memberInfo struct {
	ID          string `json:"id"`
	RaftAddress string `json:"raft_address"`
	APIURL      string `json:"api_url,omitempty"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
}

// clusterInfo is GET /admin/cluster's answer.
type clusterInfo struct {
	Self    string       `json:"self"`
	Members []memberInfo `json:"members"`
}

// addRequest is POST /admin/cluster/members's body.
type addRequest struct {
	ID          string `json:"id"`
	RaftAddress string `json:"raft_address"`
}

func adminHandler(led *allocator.Member, peers cluster.PeerProgress, urls map[raft.ServerID]string, log *slog.Logger) http.Handler {
	a := &admin{led: led, node: led.Node(), peers: peers, urls: urls, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/cluster", a.members)
	mux.HandleFunc("POST /admin/cluster/members", a.onLeader(a.add))
	mux.HandleFunc("DELETE /admin/cluster/members/{id}", a.onLeader(a.remove))
	mux.HandleFunc("GET /admin/backup", a.onLeader(a.backup))
	mux.HandleFunc("POST /admin/restore", a.onLeader(a.restore))
	return mux
}

type admin struct {
	led   *allocator.Member
	node  *cluster.Node
	peers cluster.PeerProgress
	urls  map[raft.ServerID]string
	log   *slog.Logger
}

// onLeader runs h on the leader; a follower redirects to the leader.
func (a *admin) onLeader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.node.IsLeader() {
			h(w, r)
			return
		}
		_, id := a.node.Leader()
		if u := a.urls[id]; u != "" {
			http.Redirect(w, r, u+r.URL.RequestURI(), http.StatusTemporaryRedirect)
			return
		}
		http.Error(w, "allocator: not the leader, and no leader URL known", http.StatusServiceUnavailable)
	}
}

func (a *admin) members(w http.ResponseWriter, _ *http.Request) {
	servers, err := a.node.Members()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, leader := a.node.Leader()
	out := clusterInfo{Self: string(a.node.ID())}
	for _, s := range servers {
		out.Members = append(out.Members, memberInfo{ID: string(s.ID), RaftAddress: string(s.Address), APIURL: a.urls[s.ID],
			Voter: s.Suffrage == raft.Voter, Leader: s.ID == leader})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func (a *admin) add(w http.ResponseWriter, r *http.Request) {
	var req addRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
		http.Error(w, "allocator: add: want {\"id\": ..., \"raft_address\": \"host:port\"}: "+err.Error(), http.StatusBadRequest)
		return
	}
	if host, _, err := net.SplitHostPort(req.RaftAddress); req.ID == "" || err != nil || host == "" {
		http.Error(w, "allocator: add: an id and a raft_address host:port are required", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	if err := a.node.AddMember(ctx, raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddress), a.peers); err != nil {
		a.fail(w, "add", err)
		return
	}
	a.log.Info("allocator: member added", "id", req.ID, "raft_address", req.RaftAddress)
	io.WriteString(w, "added\n")
}

func (a *admin) remove(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	if err := a.node.RemoveMember(ctx, raft.ServerID(id), a.peers); err != nil {
		a.fail(w, "remove", err)
		return
	}
	a.log.Info("allocator: member removed", "id", id)
	io.WriteString(w, "removed\n")
}

func (a *admin) backup(w http.ResponseWriter, _ *http.Request) {
	b := a.node.Backup()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.Write(b)
}

func (a *admin) restore(w http.ResponseWriter, r *http.Request) {
	limit := int64(min(max(2*len(a.node.Backup()), minRestoreBytes), cluster.MaxSnapshotBytes))
	b, err := cluster.ReadBackupFrom(r.Body, limit)
	switch {
	case errors.Is(err, cluster.ErrBackupTooLarge):
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("allocator: restore: %v (twice this cluster's state, and at least %d)", err, minRestoreBytes),
			http.StatusRequestEntityTooLarge)
		return
	case err != nil:
		w.Header().Set("Connection", "close")
		a.fail(w, "restore", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	if err := a.led.RestoreBackup(ctx, b); err != nil {
		a.fail(w, "restore", err)
		return
	}
	a.log.Warn("allocator: state restored from a backup", "bytes", len(b))
	io.WriteString(w, "restored\n")
}

// fail answers a failed operation with the reason: 400 for a backup
// refused, 404 for a member that is not one, 409 for a membership change
// refused, 503 when the member is (no longer) the leader, the outcome is
// unknown or a new member has not caught up (retry), 500 otherwise.
func (a *admin) fail(w http.ResponseWriter, op string, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, cluster.ErrBadBackup):
		code = http.StatusBadRequest
	case errors.Is(err, cluster.ErrNotMember):
		code = http.StatusNotFound
	case errors.Is(err, cluster.ErrMembership):
		code = http.StatusConflict
	case errors.Is(err, cluster.ErrNotLeader), errors.Is(err, cluster.ErrOutcomeUnknown), errors.Is(err, cluster.ErrNotCaughtUp):
		code = http.StatusServiceUnavailable
	}
	a.log.Warn("allocator: admin operation refused or failed", "op", op, "status", code, "err", err)
	http.Error(w, "allocator: "+op+": "+err.Error(), code)
}
