package certs

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// FileCertificate serves the key pair in Dir (tls.crt, tls.key) to TLS handshakes, the files as
// they are at each handshake: the metrics server uses it to serve the certificate kmm keeps in the
// webhook's certificate directory (copied there from the Secret, or mounted by the kubelet from
// cert-manager's Secret). Files that do not exist yet make the handshake fail (the first seconds
// after a start with self-managed certificates); a pair that does not match (the key written, its
// certificate not yet) keeps the pair served before.
type FileCertificate struct {
	Dir string

	mu    sync.Mutex
	cert  *tls.Certificate
	stamp [2]fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// GetCertificate is the tls.Config callback.
func (f *FileCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	certPath, keyPath := filepath.Join(f.Dir, CertFile), filepath.Join(f.Dir, KeyFile)
	var now [2]fileStamp
	for i, p := range []string{certPath, keyPath} {
		st, err := os.Stat(p)
		if err != nil {
			if f.cert != nil {
				return f.cert, nil
			}
			return nil, fmt.Errorf("no serving certificate yet: %w", err)
		}
		now[i] = fileStamp{mod: st.ModTime(), size: st.Size()}
	}
	if f.cert != nil && now == f.stamp {
		return f.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		if f.cert != nil {
			return f.cert, nil
		}
		return nil, fmt.Errorf("the serving certificate in %s: %w", f.Dir, err)
	}
	f.cert, f.stamp = &pair, now
	return f.cert, nil
}
