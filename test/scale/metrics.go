package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/kmm-project/kmm/internal/apipath"
	"github.com/kmm-project/kmm/test/envtest"
)

// sample is one line of a Prometheus text exposition: a metric name, its labels and its value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the samples of the metrics named in names (all when names is empty).
func parseMetrics(r io.Reader, names ...string) ([]sample, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if len(want) > 0 && !want[name] {
			continue
		}
		s := sample{name: name, labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				return nil, fmt.Errorf("malformed metric line %q", line)
			}
			parseLabels(rest[1:end], s.labels)
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("metric line without a value: %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels parses `a="x",b="y"` into into (label values without escaped quotes, as the
// metrics read here have).
func parseLabels(s string, into map[string]string) {
	for s != "" {
		eq := strings.Index(s, `="`)
		if eq < 0 {
			return
		}
		key := strings.TrimLeft(s[:eq], ", ")
		s = s[eq+2:]
		end := strings.Index(s, `"`)
		if end < 0 {
			return
		}
		into[key] = s[:end]
		s = s[end+1:]
	}
}

// scrape GETs url with hc and parses the named metrics.
func scrape(ctx context.Context, hc *http.Client, url string, names ...string) ([]sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body, names...)
}

// Requests counts API requests by "VERB resource[/subresource]", VERB as the API server's
// apiserver_request_total spells it (GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, ...).
type Requests map[string]int

// writeVerbs are the verbs that change objects.
var writeVerbs = map[string]bool{"POST": true, "CREATE": true, "PUT": true, "UPDATE": true, "PATCH": true,
	"APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// isWrite says whether key ("VERB resource") is a write.
func isWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	return writeVerbs[verb]
}

// apiserverRequests sums apiserver_request_total by verb and resource.
func apiserverRequests(samples []sample) Requests {
	out := Requests{}
	for _, s := range samples {
		if s.name != "apiserver_request_total" || s.labels["resource"] == "" {
			continue
		}
		key := s.labels["verb"] + " " + s.labels["resource"]
		if sub := s.labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		out[key] += int(s.value)
	}
	return out
}

// bodySize is the sum and count of apiserver_request_body_size_bytes for one verb and resource.
type bodySize struct{ sum, count float64 }

// bodySizes reads apiserver_request_body_size_bytes by "verb resource" (the API server's own
// spelling of the verb: update, patch, create, ...).
func bodySizes(samples []sample) map[string]bodySize {
	out := map[string]bodySize{}
	for _, s := range samples {
		key := s.labels["verb"] + " " + s.labels["resource"]
		b := out[key]
		switch s.name {
		case "apiserver_request_body_size_bytes_sum":
			b.sum += s.value
		case "apiserver_request_body_size_bytes_count":
			b.count += s.value
		default:
			continue
		}
		out[key] = b
	}
	return out
}

// meanBodySizes is the mean body size by "verb resource" of the requests between two readings.
func meanBodySizes(before, after map[string]bodySize) map[string]float64 {
	out := map[string]float64{}
	for k, a := range after {
		if n := a.count - before[k].count; n > 0 {
			out[k] = (a.sum - before[k].sum) / n
		}
	}
	return out
}

// minus is r - o, without zero entries.
func (r Requests) minus(o Requests) Requests {
	out := Requests{}
	for k, v := range r {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range o {
		if _, ok := r[k]; !ok && v != 0 {
			out[k] = -v
		}
	}
	return out
}

// writes sums the writes, leaving out the resources in except.
func (r Requests) writes(except ...string) int {
	n := 0
outer:
	for k, v := range r {
		if !isWrite(k) {
			continue
		}
		_, res, _ := strings.Cut(k, " ")
		for _, e := range except {
			if res == e || strings.HasPrefix(res, e+"/") {
				continue outer
			}
		}
		n += v
	}
	return n
}

// counter is a RoundTripper counting the requests of the harness's own clients (the agent's
// included) the way the API server counts them, so that they can be told apart from the operator's.
type counter struct {
	next http.RoundTripper
	mu   *sync.Mutex
	reqs Requests
}

func (c counter) RoundTrip(req *http.Request) (*http.Response, error) {
	key := requestKey(req.Method, req.URL, req.Header.Get("Content-Type"))
	c.mu.Lock()
	c.reqs[key]++
	c.mu.Unlock()
	return c.next.RoundTrip(req)
}

// requestKey names a request as apiserver_request_total does: verb, resource, subresource.
func requestKey(method string, u *url.URL, contentType string) string {
	p, ok := apipath.Parse(u.Path)
	if !ok {
		return method + " " + u.Path
	}
	resource, name, sub := p.Resource, p.Name, p.Subresource
	verb := method
	switch {
	case method == http.MethodGet && u.Query().Get("watch") == "true":
		verb = "WATCH"
	case method == http.MethodGet && name == "":
		verb = "LIST"
	case method == http.MethodPatch && strings.Contains(contentType, "apply-patch"):
		verb = "APPLY"
	}
	key := verb + " " + resource
	if sub != "" {
		key += "/" + sub
	}
	return key
}

// procStats reads a process's peak resident set size (VmHWM, MiB) and CPU time (user+system, s).
func procStats(pid int) (peakRSSMiB, cpuSeconds float64, err error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			kb, _ := strconv.ParseFloat(f[0], 64)
			peakRSSMiB = kb / 1024
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndex(s, ")")+1:])
	// Fields 14 and 15 of /proc/<pid>/stat (utime, stime), counted after the command name.
	const clockTicks = 100
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return peakRSSMiB, (utime + stime) / clockTicks, nil
}

// processCPU is the CPU seconds so far of the harness itself (with its agent) and of its child
// processes named kube-apiserver and etcd, keyed by those names.
func processCPU() map[string]float64 {
	out := map[string]float64{}
	if _, cpu, err := procStats(os.Getpid()); err == nil {
		out["harness+agent"] = cpu
	}
	for _, c := range envtest.Children() {
		if c.Name != "kube-apiserver" && c.Name != "etcd" {
			continue
		}
		if _, cpu, err := procStats(c.PID); err == nil {
			out[c.Name] += cpu
		}
	}
	return out
}
