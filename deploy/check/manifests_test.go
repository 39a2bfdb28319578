package check

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const manifestDir = repoRoot + "/deploy/kubernetes"

// manifests are the objects of deploy/kubernetes, by kind and name.
type manifests struct {
	namespaces   map[string]*corev1.Namespace
	services     map[string]*corev1.Service
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	budgets      map[string]*policyv1.PodDisruptionBudget
}

// decodeManifests decodes every document of every .yaml file in dir
// strictly: a kind this check does not know, a field the API type does
// not have, or a field given twice is an error.
func decodeManifests(dir string) (manifests, error) {
	m := manifests{
		namespaces:   map[string]*corev1.Namespace{},
		services:     map[string]*corev1.Service{},
		statefulSets: map[string]*appsv1.StatefulSet{},
		deployments:  map[string]*appsv1.Deployment{},
		budgets:      map[string]*policyv1.PodDisruptionBudget{},
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return m, fmt.Errorf("no manifest in %s (%v)", dir, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return m, err
		}
		for i, doc := range splitDocuments(data) {
			if err := m.add(doc); err != nil {
				return m, fmt.Errorf("%s, document %d: %w", filepath.Base(f), i+1, err)
			}
		}
	}
	return m, nil
}

// splitDocuments splits a YAML stream at its "---" lines and drops the
// documents that hold only comments.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		for _, line := range strings.Split(doc, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, []byte(doc))
				break
			}
		}
	}
	return docs
}

func (m manifests) add(doc []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	name := head.Metadata.Name
	if name == "" {
		return fmt.Errorf("%s %s without metadata.name", head.APIVersion, head.Kind)
	}
	var obj any
	switch gvk := head.APIVersion + " " + head.Kind; gvk {
	case "v1 Namespace":
		obj = putNew(m.namespaces, name)
	case "v1 Service":
		obj = putNew(m.services, name)
	case "apps/v1 StatefulSet":
		obj = putNew(m.statefulSets, name)
	case "apps/v1 Deployment":
		obj = putNew(m.deployments, name)
	case "policy/v1 PodDisruptionBudget":
		obj = putNew(m.budgets, name)
	default:
		return fmt.Errorf("%s %q: a kind this check does not decode", gvk, name)
	}
	if obj == nil {
		return fmt.Errorf("%s %s %q defined twice", head.APIVersion, head.Kind, name)
	}
	// UnmarshalStrict: a field the type does not have is an error, not
	// silently dropped as kubectl apply's client-side decoding may.
	return yaml.UnmarshalStrict(doc, obj)
}

// putNew stores a new T under name and returns it, or nil if name is taken.
func putNew[T any](m map[string]*T, name string) *T {
	if _, ok := m[name]; ok {
		return nil
	}
	v := new(T)
	m[name] = v
	return v
}

// secrets are the Secrets the docs' recipe creates, name -> the key of
// its one file: every Secret the manifests mount must be one of them.
func documentedSecrets(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(repoRoot + "/docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`kubectl -n ration create secret generic (\S+) --from-file=([^=\s]+)=`)
	out := map[string]string{}
	for _, m := range re.FindAllSubmatch(doc, -1) {
		out[string(m[1])] = string(m[2])
	}
	if len(out) == 0 {
		t.Fatal("docs/deploy.md creates no Secret with kubectl -n ration create secret generic")
	}
	return out
}

// container is one container of a pod template with its command's
// invocation read off it.
type container struct {
	spec  *corev1.Container
	pod   *corev1.PodSpec
	where string
	inv   invocation
	args  map[string]string // the arguments, parsed
}

// findContainer returns the container of pod (regular, or a sidecar
// among the init containers) that runs /usr/local/bin/<cmd.name>, its env
// resolved for the pod named podName.
func findContainer(pod *corev1.PodSpec, where, podName string, cmd command) (container, error) {
	var found []*corev1.Container
	for _, list := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range list {
			if slices.Equal(list[i].Command, []string{"/usr/local/bin/" + cmd.name}) {
				found = append(found, &list[i])
			}
		}
	}
	if len(found) != 1 {
		return container{}, fmt.Errorf("%s: %d containers run /usr/local/bin/%s, want 1", where, len(found), cmd.name)
	}
	c := container{spec: found[0], pod: pod, where: where + ", container " + found[0].Name}
	c.inv = invocation{where: c.where, args: found[0].Args, env: map[string]string{}}
	for _, e := range found[0].Env {
		switch {
		case !strings.HasPrefix(e.Name, envPrefix):
		case e.ValueFrom == nil:
			c.inv.env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			c.inv.env[e.Name] = podName
		default:
			return c, fmt.Errorf("%s: %s comes from a source this check cannot resolve", c.where, e.Name)
		}
	}
	var err error
	c.args, err = parseArgs(c.inv.args, cmd)
	return c, err
}

func (c container) setting(cmd command, name string) string {
	return cmd.setting(name, c.args, c.inv.env)
}

// containerPort is the port of c named name.
func (c container) containerPort(name string) int32 {
	for _, p := range c.spec.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// secretFile checks that path is a file of a Secret volume mounted in c,
// read-only, with a mode the commands accept from a root-owned file
// (readable by the pod's fsGroup, never by others or writable by the
// group), and that the Secret and its key are the documented ones. It
// returns the Secret's name.
func (c container) secretFile(path string, secrets map[string]string) (string, []string) {
	dir, file := filepath.Split(path)
	for _, vm := range c.spec.VolumeMounts {
		if filepath.Clean(vm.MountPath) != filepath.Clean(dir) {
			continue
		}
		var problems []string
		if !vm.ReadOnly {
			problems = append(problems, fmt.Sprintf("%s: mount %s of %s is not readOnly", c.where, vm.MountPath, path))
		}
		for _, v := range c.pod.Volumes {
			if v.Name != vm.Name {
				continue
			}
			if v.Secret == nil {
				return "", append(problems, fmt.Sprintf("%s: %s is on volume %s, not a Secret", c.where, path, v.Name))
			}
			key, ok := secrets[v.Secret.SecretName]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: Secret %s is not among those docs/deploy.md creates", c.where, v.Secret.SecretName))
			case key != file:
				problems = append(problems, fmt.Sprintf("%s: %s reads key %q of Secret %s, whose key is %q", c.where, path, file, v.Secret.SecretName, key))
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o027 != 0 {
				problems = append(problems, fmt.Sprintf("%s: Secret volume %s: defaultMode must leave out others and group write (0440)", c.where, v.Name))
			}
			if c.pod.SecurityContext == nil || c.pod.SecurityContext.FSGroup == nil {
				problems = append(problems, fmt.Sprintf("%s: no fsGroup: a non-root user cannot read the Secret's files", c.where))
			}
			return v.Secret.SecretName, problems
		}
		return "", append(problems, fmt.Sprintf("%s: mount %s names no volume", c.where, vm.MountPath))
	}
	return "", []string{fmt.Sprintf("%s: %s is in no mounted volume", c.where, path)}
}

// hardened reports what of the pod's and c's security settings is
// missing: a non-root user, a read-only root file system, no privilege
// escalation, no capability, no service account token.
func (c container) hardened() []string {
	var out []string
	p, s := c.pod.SecurityContext, c.spec.SecurityContext
	if p == nil || p.RunAsNonRoot == nil || !*p.RunAsNonRoot || p.RunAsUser == nil || *p.RunAsUser == 0 {
		out = append(out, c.where+": the pod does not run as a non-root user (runAsNonRoot, runAsUser)")
	}
	if s == nil || s.ReadOnlyRootFilesystem == nil || !*s.ReadOnlyRootFilesystem {
		out = append(out, c.where+": the root file system is writable")
	}
	if s == nil || s.AllowPrivilegeEscalation == nil || *s.AllowPrivilegeEscalation {
		out = append(out, c.where+": privilege escalation is allowed")
	}
	if s == nil || s.Capabilities == nil || !slices.Equal(s.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		out = append(out, c.where+": capabilities are not all dropped")
	}
	if c.pod.AutomountServiceAccountToken == nil || *c.pod.AutomountServiceAccountToken {
		out = append(out, c.where+": the service account token is mounted (the commands do not call the Kubernetes API)")
	}
	return out
}

// port is the port of a host:port listen address ("", ":7450").
func port(addr string) (int32, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(p)
	return int32(n), err
}

// probeProblems checks that pr is an HTTP GET of path on the container
// port that serves the flag's listen address.
func (c container) probeProblems(kind string, pr *corev1.Probe, path string, listenPort int32) []string {
	if pr == nil || pr.HTTPGet == nil {
		return []string{fmt.Sprintf("%s: no %s probe by HTTP GET", c.where, kind)}
	}
	var out []string
	if pr.HTTPGet.Path != path {
		out = append(out, fmt.Sprintf("%s: %s probe GETs %s, want %s", c.where, kind, pr.HTTPGet.Path, path))
	}
	got := pr.HTTPGet.Port.IntVal
	if pr.HTTPGet.Port.StrVal != "" {
		got = c.containerPort(pr.HTTPGet.Port.StrVal)
	}
	if got != listenPort {
		out = append(out, fmt.Sprintf("%s: %s probe on port %d, but the lease API listens on %d", c.where, kind, got, listenPort))
	}
	return out
}

// selects reports whether selector matches every label it names in labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// allocatorProblems checks the allocator StatefulSet against its
// Service, its PodDisruptionBudget, the documented Secrets and the
// allocator's flags. It returns the peers' lease API URLs for the
// gateways' check.
func allocatorProblems(m manifests, secrets map[string]string, alloc command) ([]string, []string) {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	sts := m.statefulSets["allocator"]
	if sts == nil {
		return []string{"no StatefulSet allocator"}, nil
	}
	ns := sts.Namespace
	if m.namespaces[ns] == nil {
		bad("StatefulSet allocator: namespace %q is not defined", ns)
	}
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	if replicas < 3 || replicas%2 == 0 {
		bad("StatefulSet allocator: %d replicas; a cluster needs an odd number, at least 3", replicas)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		bad("StatefulSet allocator: podManagementPolicy %q; OrderedReady waits for allocator-0 to be ready, which it is not without a majority", sts.Spec.PodManagementPolicy)
	}
	podLabels := sts.Spec.Template.Labels
	if sts.Spec.Selector == nil || !selects(sts.Spec.Selector.MatchLabels, podLabels) {
		bad("StatefulSet allocator: its selector does not match its pod template")
	}
	svc := m.services[sts.Spec.ServiceName]
	switch {
	case svc == nil:
		bad("StatefulSet allocator: serviceName %q is not defined", sts.Spec.ServiceName)
	case svc.Namespace != ns:
		bad("Service %s: namespace %q, the StatefulSet's is %q", svc.Name, svc.Namespace, ns)
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		bad("Service %s: not headless (clusterIP: None): the members get no stable names", svc.Name)
	case !svc.Spec.PublishNotReadyAddresses:
		bad("Service %s: publishNotReadyAddresses is off: members not yet ready cannot resolve each other to elect a leader", svc.Name)
	case !selects(svc.Spec.Selector, podLabels):
		bad("Service %s: its selector does not match the StatefulSet's pods", svc.Name)
	}
	pdb := m.budgets["allocator"]
	switch {
	case pdb == nil:
		bad("no PodDisruptionBudget allocator")
	case pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, podLabels):
		bad("PodDisruptionBudget allocator: its selector does not match the StatefulSet's pods")
	case pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 || replicas-int32(pdb.Spec.MaxUnavailable.IntValue()) <= replicas/2:
		bad("PodDisruptionBudget allocator: maxUnavailable must allow one member down and keep a majority of %d", replicas)
	}

	c, err := findContainer(&sts.Spec.Template.Spec, "StatefulSet allocator", "allocator-0", alloc)
	if err != nil {
		return append(out, err.Error()), nil
	}
	out = append(out, c.hardened()...)
	apiPort, raftPort := c.containerPort("api"), c.containerPort("raft")
	if p, err := port(c.setting(alloc, "listen")); err != nil || p != apiPort {
		bad("%s: -listen %q, but container port api is %d", c.where, c.setting(alloc, "listen"), apiPort)
	}
	if p, err := port(c.setting(alloc, "cluster-listen")); err != nil || p != raftPort {
		bad("%s: -cluster-listen %q, but container port raft is %d", c.where, c.setting(alloc, "cluster-listen"), raftPort)
	}
	if svc != nil {
		for _, sp := range svc.Spec.Ports {
			if want := c.containerPort(sp.TargetPort.StrVal); sp.TargetPort.StrVal == "" || want == 0 || sp.Port != want {
				bad("Service %s: port %s (%d -> %s) is not the container's port of that name", svc.Name, sp.Name, sp.Port, sp.TargetPort.String())
			}
		}
	}
	out = append(out, c.probeProblems("readiness", c.spec.ReadinessProbe, "/readyz", apiPort)...)
	out = append(out, c.probeProblems("liveness", c.spec.LivenessProbe, "/healthz", apiPort)...)

	// Each member's id is its pod's name, and the peers list names every
	// pod by its stable name under the headless Service.
	if ref := envSource(c.spec, "RATION_CLUSTER_ID"); ref != "metadata.name" {
		bad("%s: RATION_CLUSTER_ID must come from the pod's name (fieldRef metadata.name), not %q", c.where, ref)
	}
	var urls []string
	peers := strings.Split(c.setting(alloc, "cluster-peers"), ",")
	if int32(len(peers)) != replicas {
		bad("%s: -cluster-peers lists %d members, the StatefulSet runs %d", c.where, len(peers), replicas)
	}
	for i, p := range peers {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		host := fmt.Sprintf("%s.%s.%s.svc", pod, sts.Spec.ServiceName, ns)
		want := fmt.Sprintf("%s=%s:%d=http://%s:%d", pod, host, raftPort, host, apiPort)
		if p != want {
			bad("%s: -cluster-peers entry %d is %q, want %q", c.where, i, p, want)
		}
		urls = append(urls, fmt.Sprintf("http://%s:%d", host, apiPort))
	}

	// The data directory is the member's volume claim.
	dataDir := c.setting(alloc, "data-dir")
	var claim string
	for _, vm := range c.spec.VolumeMounts {
		if filepath.Clean(vm.MountPath) == filepath.Clean(dataDir) {
			claim = vm.Name
		}
	}
	if !slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == claim }) {
		bad("%s: -data-dir %s is not a volume claim template's mount", c.where, dataDir)
	}

	// Three credentials, each its own Secret.
	used := map[string]string{}
	for _, flag := range []string{"token-file", "admin-token-file", "peer-token-file"} {
		path := c.setting(alloc, flag)
		if path == "" {
			bad("%s: no -%s", c.where, flag)
			continue
		}
		name, problems := c.secretFile(path, secrets)
		out = append(out, problems...)
		if prev, ok := used[name]; ok && name != "" {
			bad("%s: -%s and -%s read the same Secret %s: one token in two roles is refused", c.where, prev, flag, name)
		}
		used[name] = flag
	}

	// The grace period outlasts the drain.
	drain, err := time.ParseDuration(c.setting(alloc, "shutdown-timeout"))
	if grace := sts.Spec.Template.Spec.TerminationGracePeriodSeconds; err != nil || grace == nil || time.Duration(*grace)*time.Second <= drain {
		bad("%s: terminationGracePeriodSeconds must exceed -shutdown-timeout %s", c.where, drain)
	}
	return out, urls
}

// envSource is the field path the container's variable name comes from,
// "" if it is not set from a field.
func envSource(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// gatewayProblems checks the gateway Deployment: a sidecar beside the
// gateway, started before it, on loopback, with every allocator member's
// URL and the gateways' credential.
func gatewayProblems(m manifests, secrets map[string]string, allocatorURLs []string, gatewaySecret string, side command) []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	d := m.deployments["gateway"]
	if d == nil {
		return []string{"no Deployment gateway"}
	}
	if m.namespaces[d.Namespace] == nil {
		bad("Deployment gateway: namespace %q is not defined", d.Namespace)
	}
	if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		bad("Deployment gateway: its selector does not match its pod template")
	}
	c, err := findContainer(&d.Spec.Template.Spec, "Deployment gateway", "gateway", side)
	if err != nil {
		return append(out, err.Error())
	}
	out = append(out, c.hardened()...)
	if c.spec.RestartPolicy == nil || *c.spec.RestartPolicy != corev1.ContainerRestartPolicyAlways || !slices.ContainsFunc(d.Spec.Template.Spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == c.spec.Name }) {
		bad("%s: not a native sidecar (an init container with restartPolicy Always): the gateway could start before its limiter", c.where)
	}
	listen := c.setting(side, "listen")
	if host, _, err := net.SplitHostPort(listen); !strings.HasPrefix(listen, "unix:") && (err != nil || !net.ParseIP(host).IsLoopback()) {
		bad("%s: -listen %q: the sidecar takes no credential, so it must answer on loopback (or a unix socket) only", c.where, listen)
	}
	if got := strings.Split(c.setting(side, "allocator"), ","); !slices.Equal(got, allocatorURLs) {
		bad("%s: -allocator %q, want every member's URL %q", c.where, got, allocatorURLs)
	}
	if path := c.setting(side, "token-file"); path == "" {
		bad("%s: no -token-file", c.where)
	} else {
		name, problems := c.secretFile(path, secrets)
		out = append(out, problems...)
		if name != "" && name != gatewaySecret {
			bad("%s: -token-file reads Secret %s, but the allocator's gateways' tokens are in %s", c.where, name, gatewaySecret)
		}
	}
	return out
}

// allocatorGatewaySecret is the Secret the allocator's -token-file reads.
func allocatorGatewaySecret(m manifests, alloc command) string {
	sts := m.statefulSets["allocator"]
	if sts == nil {
		return ""
	}
	c, err := findContainer(&sts.Spec.Template.Spec, "StatefulSet allocator", "allocator-0", alloc)
	if err != nil {
		return ""
	}
	dir := filepath.Dir(c.setting(alloc, "token-file"))
	for _, vm := range c.spec.VolumeMounts {
		if filepath.Clean(vm.MountPath) == dir {
			for _, v := range sts.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name && v.Secret != nil {
					return v.Secret.SecretName
				}
			}
		}
	}
	return ""
}

func TestKubernetesManifests(t *testing.T) {
	m, err := decodeManifests(manifestDir)
	if err != nil {
		t.Fatal(err)
	}
	secrets := documentedSecrets(t)
	alloc, side := loadCommand(t, "allocator"), loadCommand(t, "sidecar")

	problems, urls := allocatorProblems(m, secrets, alloc)
	problems = append(problems, gatewayProblems(m, secrets, urls, allocatorGatewaySecret(m, alloc), side)...)
	// The flags are the commands' own, and their values parse.
	for _, run := range []struct {
		cmd  command
		pod  *corev1.PodSpec
		name string
	}{
		{alloc, &m.statefulSets["allocator"].Spec.Template.Spec, "StatefulSet allocator"},
		{side, &m.deployments["gateway"].Spec.Template.Spec, "Deployment gateway"},
	} {
		c, err := findContainer(run.pod, run.name, "pod-0", run.cmd)
		if err != nil {
			t.Fatal(err)
		}
		problems = append(problems, run.cmd.problems(c.inv)...)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestKubernetesCheckBites breaks the manifests in the ways the check
// is there to catch, one at a time, and expects each to be reported.
func TestKubernetesCheckBites(t *testing.T) {
	src, err := os.ReadFile(manifestDir + "/allocator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// A misspelt field: decoded leniently, the probe would silently vanish.
	dir := t.TempDir()
	for _, f := range []string{"namespace.yaml", "gateway.yaml"} {
		data, err := os.ReadFile(filepath.Join(manifestDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	typo := bytes.Replace(src, []byte("readinessProbe:"), []byte("readinesProbe:"), 1)
	if err := os.WriteFile(filepath.Join(dir, "allocator.yaml"), typo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := decodeManifests(dir); err == nil || !strings.Contains(err.Error(), "readinesProbe") {
		t.Errorf("a misspelt field: %v, want an error naming it", err)
	}

	secrets := map[string]string{"ration-gateway-tokens": "tokens", "ration-admin-tokens": "tokens", "ration-peer-tokens": "tokens"}
	expectReported(t, "allocator.yaml", string(src), []breakage{
		{"peers name another StatefulSet's pods", "allocator-2=allocator-2.allocator", "allocator-2=alloc-2.allocator", "entry 2"},
		{"raft port differs from the container's", "- -cluster-listen=:7451", "- -cluster-listen=:7452", "-cluster-listen"},
		{"readiness probe on /healthz", "path: /readyz", "path: /healthz", "readiness probe GETs /healthz"},
		{"an undocumented Secret", "secretName: ration-peer-tokens", "secretName: ration-peer-token", "not among those docs/deploy.md creates"},
		{"one Secret for two roles", "secretName: ration-admin-tokens", "secretName: ration-gateway-tokens", "one token in two roles"},
		{"a world-readable Secret", "defaultMode: 0440", "defaultMode: 0444", "defaultMode"},
		{"ordered start", "podManagementPolicy: Parallel", "podManagementPolicy: OrderedReady", "OrderedReady"},
		{"ready-only DNS", "publishNotReadyAddresses: true", "publishNotReadyAddresses: false", "publishNotReadyAddresses"},
		{"a writable root", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "root file system is writable"},
		{"a budget that allows a majority down", "maxUnavailable: 1", "maxUnavailable: 2", "keep a majority"},
		{"a grace period shorter than the drain", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 10", "terminationGracePeriodSeconds"},
	}, func(src string) []string {
		m := manifests{namespaces: map[string]*corev1.Namespace{"ration": {}}, services: map[string]*corev1.Service{},
			statefulSets: map[string]*appsv1.StatefulSet{}, deployments: map[string]*appsv1.Deployment{}, budgets: map[string]*policyv1.PodDisruptionBudget{}}
		for _, doc := range splitDocuments([]byte(src)) {
			if err := m.add(doc); err != nil {
				return []string{err.Error()}
			}
		}
		problems, _ := allocatorProblems(m, secrets, allocatorAsUsed())
		return problems
	})
}
