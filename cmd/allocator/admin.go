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

	"github.com/rationhq/ration/allocator/cluster"
)

// The admin API of a cluster member, on its lease API listener, behind
// the bearer tokens (docs/cluster.md, "Operations"):
//
//	GET    /admin/cluster               the members as this member knows them (any member)
//	POST   /admin/cluster/members       add a voter: {"id": "d", "raft_address": "host:port"}
//	DELETE /admin/cluster/members/{id}  remove a member
//	GET    /admin/backup                the leader's applied state (application/octet-stream)
//	POST   /admin/restore               replace the cluster's state with a backup (the body)
//
// All but the first run on the leader: a follower answers 307 with the
// leader's URL when it knows one, 503 otherwise.

// maxBackupBytes caps a restore's body.
const maxBackupBytes = 4 << 30

// adminTimeout bounds a membership change or a restore.
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

func adminHandler(node *cluster.Node, urls map[raft.ServerID]string, log *slog.Logger) http.Handler {
	a := &admin{node: node, urls: urls, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/cluster", a.members)
	mux.HandleFunc("POST /admin/cluster/members", a.onLeader(a.add))
	mux.HandleFunc("DELETE /admin/cluster/members/{id}", a.onLeader(a.remove))
	mux.HandleFunc("GET /admin/backup", a.onLeader(a.backup))
	mux.HandleFunc("POST /admin/restore", a.onLeader(a.restore))
	return mux
}

type admin struct {
	node *cluster.Node
	urls map[raft.ServerID]string
	log  *slog.Logger
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
	if err := a.node.AddVoter(ctx, raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddress)); err != nil {
		a.fail(w, "add", err)
		return
	}
	a.log.Info("allocator: member added", "id", req.ID, "raft_address", req.RaftAddress)
	io.WriteString(w, "added\n")
}

func (a *admin) remove(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	servers, err := a.node.Members()
	if err != nil {
		a.fail(w, "remove", err)
		return
	}
	found := false
	for _, s := range servers {
		found = found || s.ID == raft.ServerID(id)
	}
	if !found {
		http.Error(w, fmt.Sprintf("allocator: remove: %q is not a member", id), http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	if err := a.node.RemoveServer(ctx, raft.ServerID(id)); err != nil {
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
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBackupBytes))
	if err != nil {
		http.Error(w, "allocator: restore: reading the backup: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	if err := a.node.RestoreBackup(ctx, b); err != nil {
		if errors.Is(err, cluster.ErrBadBackup) {
			http.Error(w, "allocator: restore: "+err.Error(), http.StatusBadRequest)
			return
		}
		a.fail(w, "restore", err)
		return
	}
	a.log.Warn("allocator: state restored from a backup", "bytes", len(b))
	io.WriteString(w, "restored\n")
}

// fail answers a failed operation: 503 when the member is (no longer) the
// leader or the outcome is unknown, 500 otherwise.
func (a *admin) fail(w http.ResponseWriter, op string, err error) {
	a.log.Warn("allocator: admin operation failed", "op", op, "err", err)
	code := http.StatusInternalServerError
	if errors.Is(err, cluster.ErrNotLeader) || errors.Is(err, cluster.ErrOutcomeUnknown) {
		code = http.StatusServiceUnavailable
	}
	http.Error(w, "allocator: "+op+": "+err.Error(), code)
}
