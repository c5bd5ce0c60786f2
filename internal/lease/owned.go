package lease

// Owned goroutines: everything the Manager runs in the background is waited
// for by Close.

// goOwned runs f in a goroutine that Close waits for, or reports false
// once Close has begun (f must end when m.stop does).
func (m *Manager) goOwned(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return false
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		f()
	}()
	return true
}

// spawn runs f in a goroutine that Close waits for; once Close has begun,
// it runs f inline instead.
func (m *Manager) spawn(f func()) {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		f()
		return
	}
	m.bg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.bg.Done()
		f()
	}()
}
