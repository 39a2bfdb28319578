package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/envflag"
	"github.com/rationhq/ration/internal/memberurl"
)

// isOp reports whether args (without the program name) start with an
// operations subcommand rather than the server's flags.
func isOp(args []string) bool {
	return len(args) > 0 && (args[0] == "cluster" || args[0] == "backup" || args[0] == "restore")
}

// isHelp reports whether arg asks for the usage, as the flag package
// reads -h, -help, --h and --help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--h", "--help":
		return true
	}
	return false
}

// runOp runs an operations subcommand against a cluster member's admin
// API (a follower redirects to the leader), printing what it did on out.
// With -help it prints its usage on out and returns flag.ErrHelp.
func runOp(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	name := args[0]
	args = args[1:]
	if name == "cluster" {
		switch {
		case len(args) == 0:
			return fmt.Errorf("cluster: want members, add or remove\n%s", opsUsage)
		case isHelp(args[0]):
			fmt.Fprint(out, "usage:\n"+opsUsage)
			return flag.ErrHelp
		}
		name, args = "cluster "+args[0], args[1:]
	}
	fs := flag.NewFlagSet("allocator "+name, flag.ContinueOnError)
	addr := fs.String("addr", "http://127.0.0.1:7450", "a member's lease API base URL, or every member's comma-separated (a follower redirects to the leader, followed only to a listed member)")
	tokenFile := fs.String("admin-token-file", "", "file of the admin API's bearer tokens: the first is sent (none: no Authorization header)")
	caFile := fs.String("ca", "", "PEM CA bundle to verify an https member (default: the system's)")
	timeout := fs.Duration("timeout", time.Minute, "bound on the whole operation")
	var id, raftAddr, file *string
	switch name {
	case "cluster members":
	case "cluster add":
		id = fs.String("id", "", "the new member's -cluster-id")
		raftAddr = fs.String("raft-address", "", "the new member's raft address (host:port its peers dial)")
	case "cluster remove":
		id = fs.String("id", "", "the member to remove")
	case "backup":
		file = fs.String("out", "", "file to write the backup to (- for stdout)")
	case "restore":
		file = fs.String("in", "", "backup file to restore")
	default:
		return fmt.Errorf("unknown operation %q\n%s", name, opsUsage)
	}
	if err := envflag.ParseHelp(fs, envPrefix, getenv, args, out, "usage: allocator "+name+" [flags]\n\nflags:\n"); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	switch {
	case id != nil && *id == "":
		return fmt.Errorf("%s: -id is required", name)
	case raftAddr != nil && *raftAddr == "":
		return fmt.Errorf("%s: -raft-address is required", name)
	case file != nil && *file == "":
		return fmt.Errorf("%s: -out or -in is required", name)
	}
	c, err := newOpsClient(*addr, *tokenFile, *caFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	switch name {
	case "cluster members":
		b, err := c.do(ctx, http.MethodGet, "/admin/cluster", nil)
		if err != nil {
			return err
		}
		var info clusterInfo
		if err := json.Unmarshal(b, &info); err != nil {
			return fmt.Errorf("members: %w", err)
		}
		for _, m := range info.Members {
			role := "voter"
			if !m.Voter {
				role = "nonvoter"
			}
			if m.Leader {
				role += " leader"
			}
			fmt.Fprintf(out, "%s\t%s\t%s\t%s\n", m.ID, m.RaftAddress, m.APIURL, role)
		}
	case "cluster add":
		body, _ := json.Marshal(addRequest{ID: *id, RaftAddress: *raftAddr})
		if _, err := c.do(ctx, http.MethodPost, "/admin/cluster/members", body); err != nil {
			return err
		}
		fmt.Fprintf(out, "added %s at %s\n", *id, *raftAddr)
	case "cluster remove":
		if _, err := c.do(ctx, http.MethodDelete, "/admin/cluster/members/"+url.PathEscape(*id), nil); err != nil {
			return err
		}
		fmt.Fprintf(out, "removed %s\n", *id)
	case "backup":
		b, err := c.do(ctx, http.MethodGet, "/admin/backup", nil)
		if err != nil {
			return err
		}
		if *file == "-" {
			_, err = out.Write(b)
			return err
		}
		if err := os.WriteFile(*file, b, 0o600); err != nil {
			return err
		}
		fmt.Fprintf(out, "backup: %d bytes to %s\n", len(b), *file)
	case "restore":
		b, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		if _, err := c.do(ctx, http.MethodPost, "/admin/restore", b); err != nil {
			return err
		}
		fmt.Fprintf(out, "restored %d bytes from %s\n", len(b), *file)
	}
	return nil
}

// opsClient calls a member's admin API, following the leader's redirects
// itself, and only to a member -addr lists, so that the token goes only to
// the members it is told of.
type opsClient struct {
	hc      *http.Client
	base    string          // the first member listed: where a call starts
	members map[string]bool // every listed member, as memberurl.Key
	token   string
}

// newOpsClient returns the client of the members addr lists, one base URL
// or several comma-separated.
func newOpsClient(addr, tokenFile, caFile string) (*opsClient, error) {
	c := &opsClient{members: make(map[string]bool)}
	for raw := range strings.SplitSeq(addr, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("-addr %q: want http(s)://host:port, or several comma-separated", raw)
		}
		if c.base == "" {
			c.base = strings.TrimSuffix(raw, "/")
		}
		c.members[memberurl.Key(u)] = true
	}
	if tokenFile != "" {
		tokens, err := ration.ReadTokenFile(tokenFile)
		if err != nil {
			return nil, err
		}
		c.token = tokens[0]
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-ca %s: no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c.hc = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c, nil
}

// do sends the request to the first member, and again to the leader it
// redirects to (at most 3 times) if -addr lists that leader, and returns
// the body of a 2xx answer.
func (c *opsClient) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	target := c.base + path
	for range 4 {
		req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusTemporaryRedirect:
			loc := resp.Header.Get("Location")
			if !c.listed(loc) {
				return nil, fmt.Errorf("%s %s: redirected to %q, which -addr does not list; the token is sent only to listed members: list every member in -addr (comma-separated), or give the leader's URL", method, target, loc)
			}
			target = loc
			continue
		case resp.StatusCode/100 != 2:
			return nil, fmt.Errorf("%s %s: %s: %s", method, target, resp.Status, strings.TrimSpace(string(b)))
		}
		return b, nil
	}
	return nil, errors.New("more than 3 redirects: is the leader changing?")
}

// listed reports whether raw is the URL of a page on a member -addr lists.
func (c *opsClient) listed(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return false
	}
	base := *u
	base.Path, base.RawPath, base.RawQuery = "", "", ""
	return c.members[memberurl.Key(&base)]
}
