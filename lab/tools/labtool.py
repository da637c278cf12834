#!/usr/bin/env python3
"""Host-side helpers of the gpupass QEMU lab (called by lab/lab.sh).

  modules  --src MODDIR --dst POOL -- NAME...     copy NAMEs and their deps into the pool
  missing  --pool POOL --samples DIR -- NAME...    print NAMEs the pool cannot provide
  closure  --pool POOL --samples DIR --dst DIR -- NAME...   modules of one initramfs
  collect  --data CHANNEL_LOG --out OUTROOT -- SCENARIO...  split the guest's data channel
  report   --out OUTROOT --qemu-rc N ... -- SCENARIO...     print the verdict, exit 0/1
  steps    [--kernel RELEASE] -- SCENARIO...              print each scenario's declared steps
  monitor  --socket SOCK -- COMMAND...                    QEMU human-monitor commands, replies

The guest protocol (written by lab/guest/lib.sh on /dev/ttyS1) is described in
docs/lab.md, and so are the `# lab-steps:` declarations the report enforces.
"""
import argparse
import base64
import fnmatch
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import zlib

# ---------------------------------------------------------------- modules

KO_RE = re.compile(r"\.ko(\.(xz|zst|gz))?$")


def modname(path_or_name):
    """Kernel module name: basename without .ko[.xz], '-' folded to '_'."""
    base = os.path.basename(path_or_name)
    base = KO_RE.sub("", base)
    return base.replace("-", "_")


def read_dep(moddir, fname="modules.dep"):
    """modules.dep: 'kernel/a/b.ko.xz: kernel/c.ko.xz kernel/d.ko.xz'."""
    deps = {}
    paths = {}
    with open(os.path.join(moddir, fname)) as f:
        for line in f:
            if ":" not in line:
                continue
            mod, rest = line.split(":", 1)
            name = modname(mod)
            paths[name] = mod
            deps[name] = [modname(d) for d in rest.split()]
    return deps, paths


def read_builtin(moddir):
    out = set()
    p = os.path.join(moddir, "modules.builtin")
    if os.path.exists(p):
        with open(p) as f:
            out = {modname(l.strip()) for l in f if l.strip()}
    return out


def closure(names, deps):
    seen, order = set(), []

    def visit(n):
        if n in seen:
            return
        seen.add(n)
        for d in deps.get(n, []):
            visit(d)
        order.append(n)

    for n in names:
        visit(n)
    return order


def decompress_to(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, "rb") as f:
        data = f.read()
    if src.endswith(".xz"):
        data = lzma.decompress(data)
    elif src.endswith(".gz"):
        data = zlib.decompress(data, wbits=31)
    elif src.endswith(".zst"):
        data = subprocess.run(["zstd", "-dc", src], check=True, stdout=subprocess.PIPE).stdout
    with open(dst, "wb") as f:
        f.write(data)


def plain_ko(rel):
    return KO_RE.sub(".ko", rel)


def ko_depends(path):
    """The 'depends=' entry of a .ko's .modinfo section."""
    with open(path, "rb") as f:
        data = f.read()
    m = re.search(rb"\x00depends=([^\x00]*)\x00", data)
    if not m or not m.group(1):
        return []
    return [modname(x.decode()) for x in m.group(1).split(b",") if x]


def cmd_modules(a):
    deps, paths = read_dep(a.src)
    builtin = read_builtin(a.src)
    os.makedirs(a.dst, exist_ok=True)
    # Keep the full dependency table and metadata so later runs can compute
    # closures without the original tree.
    shutil.copy(os.path.join(a.src, "modules.dep"), os.path.join(a.dst, "modules.dep.full"))
    for meta in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        p = os.path.join(a.src, meta)
        if os.path.exists(p):
            shutil.copy(p, os.path.join(a.dst, meta))
    want = [modname(n) for n in a.names]
    unknown = [n for n in want if n not in paths and n not in builtin]
    # Sample modules are built separately; anything else unknown is a warning.
    for n in closure([n for n in want if n in paths], deps):
        src = os.path.join(a.src, paths[n])
        dst = os.path.join(a.dst, plain_ko(paths[n]))
        if not os.path.exists(dst):
            decompress_to(src, dst)
    pool = set(load_pool(a.dst)) | set(closure([n for n in want if n in paths], deps))
    with open(os.path.join(a.dst, "pool.list"), "w") as f:
        f.write("\n".join(sorted(pool)) + "\n")
    for n in unknown:
        if n not in ("mtty", "mdpy", "mdpy_fb", "mbochs"):
            print(f"labtool: warning: module {n} not in this kernel", file=sys.stderr)
    return 0


def pool_dep_file(pool):
    """The dependency table of a pool: the 6.1 leg's extracted subset keeps the package's full
    table as modules.dep.full; the 6.12 leg's pool is a whole `modules_install` tree (built by
    lab/kernel/build.sh), whose own modules.dep lists everything it has."""
    full = os.path.join(pool, "modules.dep.full")
    return "modules.dep.full" if os.path.exists(full) else "modules.dep"


def load_pool(pool):
    p = os.path.join(pool, "pool.list")
    if os.path.exists(p):
        with open(p) as f:
            return [l.strip() for l in f if l.strip()]
    # No pool.list: a whole modules_install tree (6.12), every module in its modules.dep.
    if os.path.exists(os.path.join(pool, "modules.dep")):
        return list(read_dep(pool)[1])
    return []


def cmd_missing(a):
    have = set(load_pool(a.pool)) | read_builtin(a.pool)
    samples = {modname(f) for f in os.listdir(a.samples)} if os.path.isdir(a.samples) else set()
    miss = [n for n in a.names if modname(n) not in have and modname(n) not in samples]
    if miss:
        print(" ".join(miss))
    return 0


def cmd_closure(a):
    deps, paths = read_dep(a.pool, pool_dep_file(a.pool))
    builtin = read_builtin(a.pool)
    samples = {}
    if os.path.isdir(a.samples):
        for f in os.listdir(a.samples):
            # A kernel built with its samples (6.12) has them in its own tree: take them from there.
            if modname(f) not in paths:
                samples[modname(f)] = os.path.join(a.samples, f)
    want = []
    for n in a.names:
        n = modname(n)
        if n in samples:
            want += ko_depends(samples[n])
        else:
            want.append(n)
    bad = [n for n in want if n not in paths and n not in builtin]
    if bad:
        print(f"labtool: modules not in kernel {os.path.basename(a.pool)}: {' '.join(bad)}", file=sys.stderr)
        return 1
    os.makedirs(a.dst, exist_ok=True)
    for n in closure([n for n in want if n in paths], deps):
        rel = plain_ko(paths[n])
        src = os.path.join(a.pool, rel)
        if not os.path.exists(src):
            print(f"labtool: {n} missing from pool ({src})", file=sys.stderr)
            return 1
        dst = os.path.join(a.dst, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(src, dst)
    for n in a.names:
        if modname(n) in samples:
            os.makedirs(os.path.join(a.dst, "extra"), exist_ok=True)
            shutil.copy(samples[modname(n)], os.path.join(a.dst, "extra"))
    for meta in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        p = os.path.join(a.pool, meta)
        if os.path.exists(p):
            shutil.copy(p, os.path.join(a.dst, meta))
    return 0


# ---------------------------------------------------------------- collect

SAFE_NAME = re.compile(r"^[A-Za-z0-9._+-]+$")
RESERVED = {"console.log", "channel.log", "qemu.cmdline", "guest.json", "host-check.log", "judge.log",
            "judge.err", "verdict"}


def parse_channel(path):
    """Parse the guest data channel into a dict of per-scenario records."""
    st = {"boot": [], "done": False, "kernel": None, "scen": {}, "errors": []}

    def rec(s):
        return st["scen"].setdefault(s, {"begun": False, "end_rc": None, "results": [], "files": {}})

    cur_file = None  # (scen, name, [chunks])
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", "replace")
    for line in raw.splitlines():
        line = line.rstrip("\r")
        if cur_file is not None:
            if line.startswith("LAB-FILE-END "):
                parts = line.split()
                scen, name, chunks = cur_file
                cur_file = None
                try:
                    data = base64.b64decode("".join(chunks), validate=False)
                except Exception as e:  # noqa: BLE001
                    st["errors"].append(f"{scen}/{name}: bad base64: {e}")
                    continue
                size = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None
                md5 = parts[4] if len(parts) > 4 else None
                ok = (size is None or size == len(data)) and (md5 is None or hashlib.md5(data).hexdigest() == md5)
                rec(scen)["files"][name] = {"data": data, "ok": ok, "size": len(data), "want_size": size}
            else:
                cur_file[2].append(line.strip())
            continue
        parts = line.split(None, 4)
        if not parts:
            continue
        tag = parts[0]
        if tag == "LAB-BOOT":
            st["kernel"] = line[len("LAB-BOOT "):]
        elif tag == "LAB-DONE":
            st["done"] = True
        elif tag == "LAB-BEGIN" and len(parts) >= 2:
            rec(parts[1])["begun"] = True
            st["last_scen"] = parts[1]
            st["inside"] = parts[1]
        elif tag == "LAB-END" and len(parts) >= 3:
            rec(parts[1])["end_rc"] = int(parts[2]) if parts[2].lstrip("-").isdigit() else -1
            st["inside"] = None
        elif tag == "LAB-RESULT" and len(parts) >= 4:
            r = {"step": parts[2], "status": parts[3], "detail": parts[4] if len(parts) > 4 else ""}
            # "boot" results outside LAB-BEGIN/LAB-END are the init's own (modprobe) steps;
            # inside, they belong to a scenario named "boot" (lab/scenarios/boot.sh).
            if parts[1] == "boot" and st.get("inside") != "boot":
                st["boot"].append(r)
            else:
                rec(parts[1])["results"].append(r)
        elif tag == "LAB-FILE-BEGIN" and len(parts) >= 3:
            cur_file = (parts[1], parts[2], [])
    if cur_file is not None:
        st["errors"].append(f"{cur_file[0]}/{cur_file[1]}: file transfer cut off")
        rec(cur_file[0])["results"].append(
            {"step": "file-" + cur_file[1], "status": "FAIL", "detail": "transfer cut off (guest died?)"})
    return st


def cmd_collect(a):
    st = parse_channel(a.data)
    rc = 0
    for s in a.scenarios:
        d = os.path.join(a.out, s)
        os.makedirs(d, exist_ok=True)
        r = st["scen"].get(s, {"begun": False, "end_rc": None, "results": [], "files": {}})
        files = []
        for name, fd in r["files"].items():
            if not SAFE_NAME.match(name) or name in RESERVED:
                r["results"].append({"step": "file-" + name, "status": "FAIL", "detail": "unsafe or reserved file name"})
                rc = 1
                continue
            with open(os.path.join(d, name), "wb") as f:
                f.write(fd["data"])
            files.append(name)
            if not fd["ok"]:
                r["results"].append({"step": "file-" + name, "status": "FAIL",
                                     "detail": f"corrupt transfer: got {fd['size']} bytes, want {fd['want_size']}"})
                rc = 1
        rec = {"scenario": s, "kernel": st["kernel"], "done": st["done"], "boot": st["boot"],
               "begun": r["begun"], "end_rc": r["end_rc"], "results": r["results"], "files": files,
               "last_scenario_begun": st.get("last_scen"), "errors": st["errors"]}
        with open(os.path.join(d, "guest.json"), "w") as f:
            json.dump(rec, f, indent=1)
    return rc


# ---------------------------------------------------------------- declared steps

SCENARIOS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scenarios")
STEPS_RE = re.compile(r"^# lab-steps(?:-([0-9][0-9.]*))?:(.*)$")
MIN_RE = re.compile(r"^(.+)>=([0-9]+)$")


def leg_matches(leg, release):
    """A `# lab-steps-LEG:` line applies when the booted kernel's release is LEG or LEG.x / LEG-x
    (6.1 matches 6.1.0-48-amd64, not 6.12.117)."""
    return bool(release) and (release == leg or release.startswith(leg + ".") or release.startswith(leg + "-"))


def declared_steps(path, release):
    """The step declarations of one scenario script: a list of (pattern, minimum) from its
    `# lab-steps:` lines and the `# lab-steps-LEG:` lines whose LEG the booted kernel is, or
    None when the script declares nothing. A word is a step name, a glob (`rollback-*`) or either
    with `>=N` (at least N distinct step names match); `host/NAME` is a step of the host check."""
    found, out = False, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = STEPS_RE.match(line.rstrip("\n"))
            if not m:
                continue
            found = True
            if m.group(1) and not leg_matches(m.group(1), release):
                continue
            for word in m.group(2).split():
                mm = MIN_RE.match(word)
                out.append((mm.group(1), int(mm.group(2))) if mm else (word, 1))
    return out if found else None


def missing_steps(decl, steps):
    """Declarations not met by the reported step names: [(pattern, minimum, matched)]."""
    names = set(steps)
    miss = []
    for pat, want in decl:
        if any(c in pat for c in "*?["):
            got = sorted(n for n in names if fnmatch.fnmatchcase(n, pat))
        else:
            got = [pat] if pat in names else []
        if len(got) < want:
            miss.append((pat, want, got))
    return miss


def describe_missing(pat, want, got):
    if want == 1 and not any(c in pat for c in "*?["):
        return f"declared step {pat} was not reported"
    if want == 1:
        return f"declared steps {pat}: none reported"
    return f"declared steps {pat}>={want}: {len(got)} reported" + (f" ({' '.join(got)})" if got else "")


JUDGE_RE = re.compile(r"^# lab-judge:\s*(\S+)")


def judged(path):
    """Whether a scenario script says `# lab-judge: rust`: its steps and verdict come from its
    Rust judge (tests/it/labjudge, run by lab.sh as lab/judge), not from `# lab-steps:` lines."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any((m := JUDGE_RE.match(l)) and m.group(1) == "rust" for l in f)
    except OSError:
        return False


def read_judge_log(d):
    """A judged scenario's judge.log: (steps, results), steps None when the judge did not run."""
    steps, results = None, []
    try:
        with open(os.path.join(d, "judge.log"), encoding="utf-8", errors="replace") as f:
            for l in f:
                p = l.rstrip("\n").split(None, 4)
                if len(p) >= 2 and p[0] == "LAB-STEPS":
                    steps = l.split()[2:]
                elif len(p) >= 4 and p[0] == "LAB-RESULT":
                    results.append({"step": p[2], "status": p[3], "detail": p[4] if len(p) > 4 else ""})
    except OSError:
        pass
    return steps, results


def cmd_steps(a):
    for s in a.scenarios:
        path = os.path.join(a.scenarios_dir, s + ".sh")
        if judged(path):
            print(f"{s}: judged in Rust (tests/it/labjudge/{s}.rs): its steps are the judge's, "
                  f"cargo run --manifest-path lab/judge/Cargo.toml -- steps {s}")
            continue
        d = declared_steps(path, a.kernel) if os.path.exists(path) else None
        words = " ".join(p if w == 1 else f"{p}>={w}" for p, w in d) if d else "(none declared)"
        print(f"{s}: {words}")
    return 0


# ---------------------------------------------------------------- report

PANIC_RE = re.compile(r"Kernel panic[^\r\n]*")


def load_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def boot_failures(a, g, console):
    """Failures of the boot as a whole (they fail every scenario of it)."""
    out = []
    for r in g.get("boot", []):
        if r["status"] != "PASS":
            out.append(f"boot/{r['step']}: {r['detail']}")
    m = PANIC_RE.search(console)
    if m:
        out.append(f"KERNEL PANIC: {m.group(0).strip()}")
    if a.qemu_rc in (124, 137):
        out.append(f"TIMEOUT after {a.timeout} s; scenario running: {g.get('last_scenario_begun') or '(none started)'}")
    elif a.qemu_rc != 0:
        out.append(f"qemu exited with status {a.qemu_rc}")
    elif not g.get("done"):
        out.append("guest did not report LAB-DONE (crashed or powered off early)")
    return out


def cmd_report(a):
    failures = []
    lines = []
    total_steps = 0
    boot_fail = None
    for s in a.scenarios:
        d = os.path.join(a.out, s)
        g = load_json(os.path.join(d, "guest.json"),
                      {"done": False, "boot": [], "begun": False, "end_rc": None, "results": [], "kernel": None})
        console = ""
        try:
            with open(os.path.join(d, "console.log"), "rb") as f:
                console = f.read().decode("utf-8", "replace")
        except OSError:
            pass
        host = []
        try:
            with open(os.path.join(d, "host-check.log")) as f:
                for l in f:
                    p = l.rstrip("\n").split(None, 4)
                    if len(p) >= 4 and p[0] == "LAB-RESULT":
                        host.append({"step": p[2], "status": p[3], "detail": p[4] if len(p) > 4 else ""})
        except OSError:
            pass

        if boot_fail is None:
            boot_fail = boot_failures(a, g, console)
            lines.append(f"== boot: kernel {g.get('kernel') or '?'}, qemu exit {a.qemu_rc}, "
                         f"boot {a.boot_seconds} s, total {a.total_seconds} s")
            nb = len(g.get("boot", []))
            lines.append(f"  {nb} boot steps ({sum(1 for r in g.get('boot', []) if r['status'] == 'PASS')} passed)")
            for f in boot_fail:
                lines.append(f"  FAIL {f}")
            failures += boot_fail

        sf = []  # this scenario's own failures
        lines.append(f"== scenario {s}")
        path = os.path.join(a.scenarios_dir, s + ".sh")
        # A judged scenario: the guest's own results are only its file transfers; its steps
        # and their results are the Rust judge's (judge.log, docs/lab.md "Judged scenarios").
        is_judged = judged(path)
        judge_steps, judge_res = read_judge_log(d) if is_judged else (None, [])
        g["results"] = g.get("results", []) + judge_res
        for r in g.get("results", []):
            lines.append(f"  {r['status']:4} {r['step']}  {r['detail']}")
        for r in host:
            lines.append(f"  {r['status']:4} host/{r['step']}  {r['detail']}")
        res = g.get("results", []) + host
        total_steps += len(res)
        for r in res:
            if r["status"] != "PASS":
                sf.append(f"{s}/{r['step']}: {r['detail']}")
        if not g.get("begun"):
            sf.append(f"{s}: scenario never started")
        elif g.get("end_rc") is None:
            last = g["results"][-1]["step"] if g.get("results") else "(no step)"
            what = "timed out" if a.qemu_rc in (124, 137) else "did not finish"
            sf.append(f"{s}: {what}; last step seen: {last}")
        elif g["end_rc"] != 0:
            sf.append(f"{s}: scenario script exited {g['end_rc']}")
        if not res:
            sf.append(f"{s}: no result lines")
        # The steps the scenario declares it reports (`# lab-steps:`): one that is not reported
        # fails the scenario, so a step that silently stops running cannot pass by accident.
        if is_judged:
            decl = [(n, 1) for n in judge_steps] if judge_steps is not None else None
        else:
            decl = declared_steps(path, g.get("kernel")) if os.path.exists(path) else None
        if is_judged and decl is None:
            why = ""
            try:
                with open(os.path.join(d, "judge.err"), encoding="utf-8", errors="replace") as f:
                    why = " ".join(f.read().split())[:300]
            except OSError:
                pass
            sf.append(f"{s}: not judged: lab.sh's judge (lab/judge) left no LAB-STEPS in judge.log"
                      + (f": {why}" if why else ""))
        elif decl is None:
            sf.append(f"{s}: declares no steps (a `# lab-steps:` line in lab/scenarios/{s}.sh; docs/lab.md)")
        else:
            reported = [r["step"] for r in g.get("results", [])] + ["host/" + r["step"] for r in host]
            miss = missing_steps(decl, reported)
            if miss and (not g.get("begun") or g.get("end_rc") is None):
                # Cut short: the failure above says where; name the first few it never reached.
                names = [p if w == 1 else f"{p}>={w}" for p, w, _ in miss]
                sf.append(f"{s}: {len(miss)} declared steps not reported: {' '.join(names[:8])}"
                          + (" ..." if len(names) > 8 else ""))
            else:
                for pat, want, got in miss:
                    lines.append(f"  MISS {pat if want == 1 else f'{pat}>={want}'}  declared in lab-steps, "
                                 f"{len(got)} reported")
                sf += [f"{s}/{describe_missing(p, w, got)}" for p, w, got in miss]
        verdict = "FAIL" if sf or boot_fail else "PASS"
        ndecl = f", {len(decl)} declared" if decl else ""
        lines.append(f"== {s}: {verdict} ({len(res)} steps{ndecl})  console: {os.path.join(d, 'console.log')}")
        with open(os.path.join(d, "verdict"), "w") as f:
            f.write(verdict + "\n" + "".join(x + "\n" for x in boot_fail + sf))
        failures += sf
    print("\n".join(lines))
    if failures:
        print("lab: FAILED:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print(f"lab: PASS ({total_steps} steps in {len(a.scenarios)} scenario(s))")
    return 0


# ---------------------------------------------------------------- monitor

def cmd_monitor(a):
    """Send each COMMAND to QEMU's human monitor on a unix socket and print the replies: the
    lab's snapshot of L1's vCPU when a boot runs out of time (docs/lab.md)."""
    import socket
    import time

    def until_prompt(c, deadline):
        buf = b""
        while not buf.endswith(b"(qemu) ") and time.time() < deadline:
            try:
                chunk = c.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            buf += chunk
        return buf.decode("utf-8", "replace")

    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(1)
    try:
        c.connect(a.socket)
    except OSError as e:
        print(f"monitor: cannot connect to {a.socket}: {e}")
        return 1
    until_prompt(c, time.time() + 5)
    for cmd in a.commands:
        c.sendall(cmd.encode() + b"\n")
        reply = until_prompt(c, time.time() + 10)
        # The monitor echoes the command (with terminal escapes) first; keep the rest.
        body = reply.split("\n", 1)[1] if "\n" in reply else reply
        print(f"== {cmd}")
        print(body.replace("(qemu) ", "").rstrip())
    c.close()
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("modules")
    m.add_argument("--src", required=True)
    m.add_argument("--dst", required=True)
    m.add_argument("names", nargs="*")
    m = sub.add_parser("missing")
    m.add_argument("--pool", required=True)
    m.add_argument("--samples", required=True)
    m.add_argument("names", nargs="*")
    m = sub.add_parser("closure")
    m.add_argument("--pool", required=True)
    m.add_argument("--samples", required=True)
    m.add_argument("--dst", required=True)
    m.add_argument("names", nargs="*")
    m = sub.add_parser("collect")
    m.add_argument("--data", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("scenarios", nargs="*")
    m = sub.add_parser("report")
    m.add_argument("--out", required=True)
    m.add_argument("--qemu-rc", type=int, required=True)
    m.add_argument("--timeout", default="?")
    m.add_argument("--boot-seconds", default="?")
    m.add_argument("--total-seconds", default="?")
    m.add_argument("--scenarios-dir", default=SCENARIOS_DIR, help="where SCENARIO.sh and its lab-steps are")
    m.add_argument("scenarios", nargs="*")
    m = sub.add_parser("steps")
    m.add_argument("--kernel", default="", help="booted kernel release (selects lab-steps-LEG lines)")
    m.add_argument("--scenarios-dir", default=SCENARIOS_DIR)
    m.add_argument("scenarios", nargs="*")
    m = sub.add_parser("monitor")
    m.add_argument("--socket", required=True)
    m.add_argument("commands", nargs="*")
    a = p.parse_args()
    return {"modules": cmd_modules, "missing": cmd_missing, "closure": cmd_closure,
            "collect": cmd_collect, "report": cmd_report, "steps": cmd_steps,
            "monitor": cmd_monitor}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
