// Package testpki makes throw-away certificate authorities and certificates
// for tests: never use it to protect anything.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// CA is a certificate authority that signs leaf certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	PEM  []byte
}

var serial atomic.Int64

func nextSerial() *big.Int { return big.NewInt(serial.Add(1) + time.Now().UnixNano()) }

// NewCA returns a self-signed CA named cn, valid from an hour ago for a day.
func NewCA(cn string) *CA {
	key := mustKey()
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CN       string
	DNS      []string
	IPs      []net.IP
	URIs     []string
	Server   bool // server auth usage (else client auth)
	Client   bool // client auth usage as well
	NotAfter time.Time
}

// Issued is a certificate and its private key, in PEM.
type Issued struct {
	CertPEM, KeyPEM []byte
}

// TLS returns the pair as a tls.Certificate.
func (i Issued) TLS() tls.Certificate {
	c, err := tls.X509KeyPair(i.CertPEM, i.KeyPEM)
	if err != nil {
		panic(err)
	}
	return c
}

// Write stores the pair as dir/name.crt and dir/name.key and returns the paths.
func (i Issued) Write(dir, name string) (certFile, keyFile string) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	mustWrite(certFile, i.CertPEM)
	mustWrite(keyFile, i.KeyPEM)
	return certFile, keyFile
}

// WriteCA stores the CA certificate as dir/name.crt and returns the path.
func (ca *CA) WriteCA(dir, name string) string {
	f := filepath.Join(dir, name+".crt")
	mustWrite(f, ca.PEM)
	return f
}

// Issue signs a leaf certificate. NotAfter defaults to a day from now.
func (ca *CA) Issue(l Leaf) Issued {
	key := mustKey()
	notAfter := l.NotAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: l.CN},
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	for _, u := range l.URIs {
		p, err := url.Parse(u)
		if err != nil {
			panic(err)
		}
		tmpl.URIs = append(tmpl.URIs, p)
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client || !l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		panic(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		panic(err)
	}
	return Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}),
	}
}

// Localhost is a server certificate for 127.0.0.1 and localhost.
func (ca *CA) Localhost() Issued {
	return ca.Issue(Leaf{CN: "localhost", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true, Client: true})
}

// Pool returns a pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func mustKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}

func mustWrite(name string, b []byte) {
	if err := os.WriteFile(name, b, 0o600); err != nil {
		panic(err)
	}
}
