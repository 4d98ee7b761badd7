#!/usr/bin/python
"""Report one end of the link between a head and a worker: interface, speed, MTU, default route, RDMA."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: link_info
short_description: Read this node's end of the head-worker link (interface, speed, MTU, RDMA)
description:
  - On the head, O(peer) is the worker's RPC address; the module asks the kernel which interface
    it routes that address over (C(ip -j route get)). On a worker, O(local_address) is the address
    the RPC server binds; the module finds the interface holding it (C(ip -j addr show)).
  - For that interface it reads the speed, MTU and state from sysfs (C(/sys/class/net/IF)), a bond's
    slaves, C(ethtool IF) where sysfs gives no speed for a physical port, the interfaces carrying a
    default route, every other interface that is up (to tell whether a faster one exists) and the
    RDMA devices sitting on it (C(/sys/class/infiniband/*/ports/*/gid_attrs/ndevs), else C(rdma link)).
  - Changes nothing.
version_added: "1.0.0"
author: minimax-spark
options:
  peer:
    description:
      - The address to route to (an IP address; a name is resolved first). Give this or O(local_address).
    type: str
  local_address:
    description:
      - An address of this node whose interface to describe. Give this or O(peer).
    type: str
  missing_ok:
    description:
      - With O(local_address), an address no interface of this node holds is reported (RV(held) false, RV(msg)
        says why) instead of failing. For a what-if plan of nodes that are not this machine; a deploying run
        leaves it off, so a worker address the node does not hold is refused.
    type: bool
    default: false
  sysfs_root:
    description:
      - Where sysfs is mounted (tests point it at a captured tree).
    type: path
    default: /sys
notes:
  - Reads C(ip) from iproute2 (with C(-j)) where it is installed; without it (a slim image) the same facts come from
    C(/proc/net) (C(route), C(ipv6_route), C(if_inet6)), each interface's IPv4 address and the kernel's choice of
    source address, and RV(source) says so. Without C(ip) only each interface's first IPv4 address is seen.
  - C(ethtool) and C(rdma) are used when present.
  - Supports check mode (it never changes anything).
extends_documentation_fragment:
  - minimax_attributes
  - minimax_attributes.read_only
attributes:
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Describe the head's route to a worker
  link_info:
    peer: 192.168.100.11
  register: head_end

- name: Describe the interface a worker's RPC server binds
  link_info:
    local_address: 192.168.100.11
  register: worker_end
"""

RETURN = r"""
address:
  description: The address the module looked up (the peer, resolved, or the local address).
  returned: always
  type: str
held:
  description: Whether an interface of this node holds O(local_address) (always true with O(peer)); false only with
    O(missing_ok), and then nothing else is returned but RV(msg).
  returned: always
  type: bool
source:
  description: Where the routes and addresses came from, C(ip), or a sentence saying C(/proc/net) and sysfs stood in
    for a missing C(ip) command.
  returned: success
  type: str
route:
  description: The kernel's route to O(peer) (null with O(local_address)).
  returned: success
  type: dict
  sample: {dev: enp1s0f0np0, src: 192.168.100.10, gateway: "", local: false}
interface:
  description:
    - The interface of the link. C(kind) is C(loopback), C(bond), C(physical) or C(virtual);
      C(speed_mbps) is null where the kernel reports none (a veth, a link down, loopback);
      C(speed_source) says where it came from (C(sysfs), C(slaves), C(ethtool), C(none)).
  returned: success
  type: dict
  sample: {name: enp1s0f0np0, kind: physical, speed_mbps: 200000, speed_source: sysfs, mtu: 9000,
           operstate: up, slaves: [], addresses: [192.168.100.10]}
default_devs:
  description: The interfaces carrying a default route.
  returned: success
  type: list
  elements: str
interfaces:
  description: Every interface that is up (loopback aside), described like RV(interface).
  returned: success
  type: list
  elements: dict
rdma:
  description: The RDMA devices on the interface, the GID the transport would use first.
  returned: success
  type: list
  elements: dict
  sample: [{device: rocep1s0f0, port: 1, gid_index: 3, gid: "0000:0000:0000:0000:0000:ffff:c0a8:640a",
            type: RoCE v2, matches_address: true}]
"""

import ipaddress
import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_link import NotHeld, gather


def resolve(name):
    """An IP address as given, or the first address a name resolves to."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return socket.getaddrinfo(name, None)[0][4][0]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            peer=dict(type="str"),
            local_address=dict(type="str"),
            missing_ok=dict(type="bool", default=False),
            sysfs_root=dict(type="path", default="/sys"),
        ),
        required_one_of=[["peer", "local_address"]],
        mutually_exclusive=[["peer", "local_address"]],
        supports_check_mode=True,
    )
    params = module.params
    try:
        address = resolve(params["peer"] or params["local_address"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="cannot resolve %s: %s; give the fast-link IP address"
                         % (params["peer"] or params["local_address"], exc))

    def run(argv):
        if module.get_bin_path(argv[0]) is None:
            return 127, "", "%s not found" % argv[0]
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    try:
        found = gather(run, peer=address if params["peer"] else None,
                       local_address=None if params["peer"] else address,
                       sysfs_net=os.path.join(params["sysfs_root"], "class", "net"),
                       sysfs_ib=os.path.join(params["sysfs_root"], "class", "infiniband"))
    except NotHeld as exc:
        if params["missing_ok"]:
            module.exit_json(changed=False, address=address, held=False, msg=str(exc))
        module.fail_json(msg=str(exc), address=address, held=False)
    except ValueError as exc:
        module.fail_json(msg=str(exc), address=address)
    module.exit_json(changed=False, address=address, held=True, **found)


if __name__ == "__main__":
    main()
