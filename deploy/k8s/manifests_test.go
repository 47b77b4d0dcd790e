package k8s

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/b2bd/b2bd/internal/daemon"
)

// manifests are the decoded objects of every *.yaml here.
type manifests struct {
	daemonSets []*appsv1.DaemonSet
	configMaps []*corev1.ConfigMap
	services   []*corev1.Service
	namespaces []*corev1.Namespace
	pods       []*corev1.Pod
}

// splitDocs cuts a YAML stream at its "---" lines, dropping empty documents.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// decodeStrict decodes one document into the k8s.io/api type of its kind,
// refusing unknown and duplicate fields.
func decodeStrict(doc []byte, m *manifests) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("read apiVersion/kind: %w", err)
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 DaemonSet":
		o := &appsv1.DaemonSet{}
		m.daemonSets, obj = append(m.daemonSets, o), o
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		m.configMaps, obj = append(m.configMaps, o), o
	case "v1 Service":
		o := &corev1.Service{}
		m.services, obj = append(m.services, o), o
	case "v1 Namespace":
		o := &corev1.Namespace{}
		m.namespaces, obj = append(m.namespaces, o), o
	case "v1 Pod":
		o := &corev1.Pod{}
		m.pods, obj = append(m.pods, o), o
	default:
		return fmt.Errorf("apiVersion %q kind %q: not a kind this test knows", tm.APIVersion, tm.Kind)
	}
	// As the API server decodes: case-sensitive field names, unknown and
	// duplicate fields refused (encoding/json alone matches names in any case).
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("%s: %w", tm.Kind, errors.Join(strict...))
	}
	return nil
}

func load(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	m := &manifests{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(b) {
			if err := decodeStrict(doc, m); err != nil {
				t.Errorf("%s document %d: %v", f, i, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

// TestStrictDecodingRefusesUnknownFields: the decoder this test relies on
// does refuse a misspelt field and an unknown kind.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"misspelt field", "apiVersion: v1\nkind: Service\nspec:\n  clusterIp: None\n", "unknown field"},
		{"unknown kind", "apiVersion: v1\nkind: Secrett\n", "not a kind"},
		{"duplicate field", "apiVersion: v1\nkind: ConfigMap\ndata: {}\ndata: {}\n", "already set"},
	} {
		err := decodeStrict([]byte(tc.doc), &manifests{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// parseTOML reads the flat `key = value` TOML the config uses (strings,
// numbers, booleans; comments and blank lines): enough to check every key
// against b2bd's flags without a TOML library.
func parseTOML(s string) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not key = value", i+1, line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if strings.HasPrefix(v, `"`) {
			u, err := strconv.Unquote(v)
			if err != nil {
				return nil, fmt.Errorf("line %d: key %s: bad string %s: %w", i+1, k, v, err)
			}
			v = u
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("line %d: key %s given twice", i+1, k)
		}
		out[k] = v
	}
	return out, nil
}

// FuzzParseTOML: the line parser never panics and only returns keys it read.
func FuzzParseTOML(f *testing.F) {
	f.Add("a = \"b\"\n# c\nd = 1\n")
	f.Add("=\n\"")
	f.Fuzz(func(t *testing.T, s string) {
		kv, err := parseTOML(s)
		if err != nil {
			return
		}
		for k := range kv {
			if !strings.Contains(s, k) {
				t.Fatalf("key %q not in input", k)
			}
		}
	})
}

// daemonFlags is b2bd's flag set, as cmd/b2bd builds it.
func daemonFlags() *flag.FlagSet {
	var cfg daemon.Config
	fs := flag.NewFlagSet("b2bd", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	daemon.RegisterKindFlags(fs, &cfg)
	return fs
}

func port(t *testing.T, what, addr string) int32 {
	t.Helper()
	_, p, err := splitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	return p
}

func splitHostPort(addr string) (string, int32, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("no port")
	}
	p, err := strconv.ParseUint(addr[i+1:], 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port: %w", err)
	}
	return addr[:i], int32(p), nil
}

func TestManifests(t *testing.T) {
	m := load(t)
	if len(m.daemonSets) != 1 || len(m.configMaps) != 1 || len(m.services) != 1 || len(m.namespaces) != 1 {
		t.Fatalf("want one DaemonSet, ConfigMap, Service and Namespace; have %d, %d, %d, %d",
			len(m.daemonSets), len(m.configMaps), len(m.services), len(m.namespaces))
	}
	ds, cm, svc, ns := m.daemonSets[0], m.configMaps[0], m.services[0], m.namespaces[0]
	for _, o := range []metav1.Object{ds, cm, svc} {
		if o.GetNamespace() != ns.Name {
			t.Errorf("%s is in namespace %q, want %q", o.GetName(), o.GetNamespace(), ns.Name)
		}
	}

	// The ConfigMap: every key is a b2bd flag and takes its value.
	const cfgKey = "b2bd.toml"
	kv, err := parseTOML(cm.Data[cfgKey])
	if err != nil {
		t.Fatalf("ConfigMap %s key %s: %v", cm.Name, cfgKey, err)
	}
	fs := daemonFlags()
	for k, v := range kv {
		if fs.Lookup(k) == nil {
			t.Errorf("config key %q is not a b2bd flag", k)
			continue
		}
		if err := fs.Set(k, v); err != nil {
			t.Errorf("config key %q = %q: %v", k, v, err)
		}
	}
	for _, k := range []string{"socket", "shm-dir", "peer-listen", "data-listen", "health-listen", "metrics-listen", "tls-cert", "tls-key", "tls-ca", "shutdown-grace"} {
		if _, ok := kv[k]; !ok {
			t.Errorf("config sets no %s", k)
		}
	}
	healthPort := port(t, "health-listen", kv["health-listen"])
	peerPort := port(t, "peer-listen", kv["peer-listen"])
	grace, err := time.ParseDuration(kv["shutdown-grace"])
	if err != nil {
		t.Fatal(err)
	}

	// The DaemonSet.
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Errorf("DaemonSet: hostPID is off: the daemon would see every client pod's pid as 0, and lease regions per connection")
	}
	if !spec.HostNetwork {
		t.Errorf("DaemonSet: hostNetwork is off")
	}
	if spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("DaemonSet: dnsPolicy %q, want ClusterFirstWithHostNet with hostNetwork", spec.DNSPolicy)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet: selector %v does not match the pod labels %v (%v)", ds.Spec.Selector, ds.Spec.Template.Labels, err)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("DaemonSet: %d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || !hasCap(sc.Capabilities.Add, "IPC_LOCK") {
		t.Errorf("container %s: no IPC_LOCK capability", c.Name)
	} else if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container %s is privileged; it needs IPC_LOCK only", c.Name)
	}
	rdma := false
	for name, q := range c.Resources.Limits {
		if strings.HasPrefix(string(name), "rdma/") {
			rdma = q.Cmp(resource.MustParse("1")) >= 0
			if r, ok := c.Resources.Requests[name]; ok && r.Cmp(q) != 0 {
				t.Errorf("container %s: %s request %s differs from its limit %s (extended resources must be equal)", c.Name, name, r.String(), q.String())
			}
		}
	}
	if !rdma {
		t.Errorf("container %s: no rdma/... device-plugin resource limit of at least 1", c.Name)
	}
	// hostPath volumes for the socket directory and /dev/shm, mounted at
	// the same paths (clients get region files by path).
	hostPaths := map[string]string{} // volume name -> host path
	configMaps := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
		if v.ConfigMap != nil {
			configMaps[v.Name] = v.ConfigMap.Name
		}
	}
	sockDir := filepath.Dir(kv["socket"])
	for _, want := range []string{sockDir, "/dev/shm"} {
		found := false
		for _, vm := range c.VolumeMounts {
			if hostPaths[vm.Name] == want && vm.MountPath == want && !vm.ReadOnly {
				found = true
			}
		}
		if !found {
			t.Errorf("container %s: no writable hostPath mount of %s at %s", c.Name, want, want)
		}
	}
	if !strings.HasPrefix(kv["shm-dir"], "/dev/shm/") {
		t.Errorf("config shm-dir %q is not under the /dev/shm hostPath", kv["shm-dir"])
	}
	// --config points at the ConfigMap's key.
	cfgPath := ""
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			cfgPath = c.Args[i+1]
		}
	}
	cfgMounted := false
	for _, vm := range c.VolumeMounts {
		if configMaps[vm.Name] == cm.Name && (vm.MountPath == cfgPath && vm.SubPath == cfgKey || filepath.Join(vm.MountPath, cfgKey) == cfgPath && vm.SubPath == "") {
			cfgMounted = true
		}
	}
	if cfgPath == "" || !cfgMounted {
		t.Errorf("container %s: --config %q is not the ConfigMap %s key %s", c.Name, cfgPath, cm.Name, cfgKey)
	}
	// Probes: gRPC on the plaintext health port.
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != healthPort {
			t.Errorf("container %s: %s probe is not gRPC on the health port %d: %+v", c.Name, name, healthPort, p)
		}
	}
	// preStop drain, inside the termination grace period with the daemon's
	// own grace.
	var preStop time.Duration
	switch {
	case c.Lifecycle == nil || c.Lifecycle.PreStop == nil:
		t.Errorf("container %s: no preStop hook", c.Name)
	case c.Lifecycle.PreStop.Sleep != nil:
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	case c.Lifecycle.PreStop.Exec == nil:
		t.Errorf("container %s: preStop is neither sleep nor exec", c.Name)
	}
	if tg := spec.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second <= preStop+grace {
		t.Errorf("DaemonSet: terminationGracePeriodSeconds %v is not above preStop %v + shutdown-grace %v", tg, preStop, grace)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["health"] != healthPort || ports["peer"] != peerPort {
		t.Errorf("container %s: ports %v; want health %d and peer %d as the config says", c.Name, ports, healthPort, peerPort)
	}

	// The headless Service selects the daemon's pods and names its ports.
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s: clusterIP %q, want None (headless)", svc.Name, svc.Spec.ClusterIP)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("Service %s: selector %v does not select the DaemonSet's pods %v", svc.Name, svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	for _, sp := range svc.Spec.Ports {
		if tp := sp.TargetPort.String(); ports[tp] == 0 {
			t.Errorf("Service %s: port %s targets %q, which the container does not name", svc.Name, sp.Name, tp)
		}
		if sp.Name == "peer" && sp.Port != peerPort {
			t.Errorf("Service %s: peer port %d, config peer-listen %d", svc.Name, sp.Port, peerPort)
		}
	}

	// The example client mounts the same paths and joins the socket's group.
	for _, p := range m.pods {
		mounts := map[string]string{}
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				mounts[v.Name] = v.HostPath.Path
			}
		}
		for _, ct := range p.Spec.Containers {
			got := map[string]bool{}
			for _, vm := range ct.VolumeMounts {
				if hp := mounts[vm.Name]; hp != "" && hp == vm.MountPath {
					got[hp] = true
				}
			}
			if !got[sockDir] || !got[kv["shm-dir"]] {
				t.Errorf("pod %s container %s: mounts %v; want %s and %s at their host paths", p.Name, ct.Name, got, sockDir, kv["shm-dir"])
			}
		}
		gid, _ := strconv.ParseInt(kv["group"], 10, 64)
		if sc := p.Spec.SecurityContext; sc == nil || !containsInt(sc.SupplementalGroups, gid) {
			t.Errorf("pod %s: not in the socket's group %s", p.Name, kv["group"])
		}
	}
}

func hasCap(cs []corev1.Capability, c corev1.Capability) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

func containsInt(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
