def test_placeholder(host):
    assert host.file("/etc/hostname").exists
