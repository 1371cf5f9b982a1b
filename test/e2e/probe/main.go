// Command probe is the test image of the e2e node test: it reports what it sees from inside its
// container, one fact a line, as its termination message (/dev/termination-log) and on stdout, and
// exits 0. The test compares the report with what the pod spec asked for. Each argument is a check:
//
//	cap:NAME        "cap NAME=true|false": NAME (sys_module, sys_admin, ...) is in the effective set
//	readonly-root   "readonly-root=true|false": creating a file in / fails with EROFS
//	read:PATH       "read PATH=CONTENT" (or "=error: ..."): the file's content, trimmed
//	write:PATH=TEXT "write PATH=ok" (or "=error: ..."): writes TEXT to PATH
//	exists:PATH     "exists PATH=true|false"
//	get:URL         "get URL=STATUS" (or "=error: ..."): the HTTP status code of a GET
//	whoami          "whoami=USER" (or "=error: ..."): the user the API server sees for the pod's
//	                service-account token, through KUBERNETES_SERVICE_HOST and _PORT (a SelfSubjectReview)
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// capabilities are the bit numbers of the capabilities a check may name (linux/capability.h).
var capabilities = map[string]uint{"net_admin": 12, "sys_module": 16, "sys_rawio": 17, "sys_admin": 21}

func main() {
	var lines []string
	for _, arg := range os.Args[1:] {
		lines = append(lines, check(arg))
	}
	report := strings.Join(lines, "\n")
	fmt.Println(report)
	if err := os.WriteFile("/dev/termination-log", []byte(report), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "writing the termination message:", err)
		os.Exit(2)
	}
}

func check(arg string) string {
	kind, val, _ := strings.Cut(arg, ":")
	switch kind {
	case "cap":
		ok, err := hasCap(val)
		return fmt.Sprintf("cap %s=%s", val, orError(strconv.FormatBool(ok), err))
	case "readonly-root":
		err := os.WriteFile("/.probe", nil, 0o600)
		if err == nil {
			_ = os.Remove("/.probe")
		}
		return fmt.Sprintf("readonly-root=%t", errors.Is(err, syscall.EROFS))
	case "read":
		data, err := os.ReadFile(val)
		return fmt.Sprintf("read %s=%s", val, orError(strings.TrimSpace(string(data)), err))
	case "write":
		p, text, _ := strings.Cut(val, "=")
		return fmt.Sprintf("write %s=%s", p, orError("ok", os.WriteFile(p, []byte(text), 0o600)))
	case "get":
		code, err := get(val)
		return fmt.Sprintf("get %s=%s", val, orError(strconv.Itoa(code), err))
	case "whoami":
		user, err := whoami()
		return "whoami=" + orError(user, err)
	case "exists":
		_, err := os.Stat(val)
		return fmt.Sprintf("exists %s=%t", val, err == nil)
	}
	return fmt.Sprintf("unknown check %q", arg)
}

func orError(s string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

// hasCap reads the effective capability set of this process from /proc/self/status.
func hasCap(name string) (bool, error) {
	bit, ok := capabilities[name]
	if !ok {
		return false, fmt.Errorf("unknown capability %q", name)
	}
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return set&(1<<bit) != 0, err
		}
	}
	return false, errors.New("no CapEff in /proc/self/status")
}

func get(url string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url) //nolint:gosec // G704: fetching the URL its argument names is the probe's job
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// serviceAccountDir is where the kubelet mounts the pod's service-account token and CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount/"

func whoami() (string, error) {
	token, err := os.ReadFile(serviceAccountDir + "token")
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(serviceAccountDir + "ca.crt")
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return "", errors.New("no certificate in ca.crt")
	}
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	//nolint:gosec // G704: the API server of the pod's own environment
	req, err := http.NewRequest(http.MethodPost, "https://"+host+"/apis/authentication.k8s.io/v1/selfsubjectreviews", bytes.NewBufferString(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req) //nolint:gosec // G704: see above
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("%s from %s", resp.Status, host)
	}
	err = json.NewDecoder(resp.Body).Decode(&review)
	return review.Status.UserInfo.Username, err
}
