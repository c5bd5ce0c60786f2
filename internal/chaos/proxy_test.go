package chaos_test

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/chaos"
)

// A partition (Blackhole) loses the bytes sent during it, and a connection
// that lost bytes never carries another one: it is closed when the
// partition heals, as TCP would end it, instead of going on with a hole (a
// gRPC stream that went on would miss watch events no real network loses).
// A connection that lost nothing survives the partition.
func TestProxyNeverDeliversAStreamWithAHole(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := chaos.NewProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	roundTrip := func(c net.Conn, r *bufio.Reader, msg string) error {
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := r.ReadString('\n')
		if err == nil && got != msg+"\n" {
			t.Fatalf("echo %q, want %q", got, msg)
		}
		return err
	}
	holed, hr := dial()
	idle, ir := dial()
	for _, c := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{holed, hr}, {idle, ir}} {
		if err := roundTrip(c.c, c.r, "before"); err != nil {
			t.Fatal(err)
		}
	}
	p.Set(chaos.Blackhole, 0)
	if _, err := holed.Write([]byte("lost\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the proxy read and drop it
	p.Set(chaos.Pass, 0)
	if err := roundTrip(holed, hr, "after"); err == nil {
		t.Fatal("a connection that lost bytes in the partition carried bytes after it")
	}
	if err := roundTrip(idle, ir, "after"); err != nil {
		t.Fatalf("a connection that lost nothing did not survive the partition: %v", err)
	}
	fresh, fr := dial()
	if err := roundTrip(fresh, fr, "new"); err != nil {
		t.Fatalf("a new connection after the partition: %v", err)
	}
}
