package embedetcd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// The member is reachable only by the process that started it (and by root
// or its own user, who could read its data directory anyway):
//
//   - clients connect through a unix socket inside a directory of mode 0700
//     owned by this user, so no other user's process can open it, whatever
//     network namespace it shares (a sidecar pod's other containers run as
//     other users or have other file systems);
//   - the peer listener, which etcd requires even for one member and which
//     would accept raft messages and lease renewals, binds 127.0.0.1 with
//     TLS and requires a client certificate signed by a CA generated at
//     start whose key is never written: nobody, not even this process, can
//     present one after start, and a single member never dials its peers.

// privateDirName is the directory in the data directory that holds the
// client socket and the peer listener's certificate.
const privateDirName = "private"

// maxSocketPath keeps a socket's path within sun_path (108 bytes on Linux,
// 104 on the BSDs, with the terminating NUL).
const maxSocketPath = 100

// privateDir makes dir (mode 0700, owned by this user, not a symlink) and
// returns it. An existing directory with a wider mode is narrowed; one owned
// by another user is refused, since that user could replace the socket.
func privateDir(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory (a symlink?); remove it", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return "", fmt.Errorf("%s belongs to uid %d, not to this process (uid %d); remove it", dir, st.Uid, os.Getuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// socketDir is the private directory for the client socket: the one in the
// data directory, or, if its path is too long for a socket, a fresh one
// under the system's temporary directory (temporary is true: remove it on
// close).
func socketDir(private string) (dir string, temporary bool, err error) {
	if len(filepath.Join(private, "client.sock")) <= maxSocketPath {
		return private, false, nil
	}
	dir, err = os.MkdirTemp("", "coordinatord-etcd-") // mode 0700
	return dir, err == nil, err
}

// peerTLS writes, in dir, a certificate for 127.0.0.1 and its key, signed by
// a CA made here and dropped at once, and returns etcd's TLS settings that
// require peers to present a certificate from that CA.
func peerTLS(dir string) (*transport.TLSInfo, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "coordinatord embedded etcd peer CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(100, 0, 0), // lives as long as the process; regenerated at every start
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "coordinatord embedded etcd peer"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(100, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	info := &transport.TLSInfo{
		CertFile:       filepath.Join(dir, "peer.crt"),
		KeyFile:        filepath.Join(dir, "peer.key"),
		TrustedCAFile:  filepath.Join(dir, "peer-ca.crt"),
		ClientCertAuth: true,
	}
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{{info.CertFile, "CERTIFICATE", leafDER}, {info.KeyFile, "PRIVATE KEY", keyDER}, {info.TrustedCAFile, "CERTIFICATE", caDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return nil, err
		}
	}
	return info, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
