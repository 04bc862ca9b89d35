/* The one table of tunables. Each entry: id, environment variable, type, default, help.
 * Values are read once (environment, then NCCL_CONF_FILE / ~/.nccl.conf / /etc/nccl.conf) and
 * cached; chorus-info prints the whole table with each value's source. Add new tunables here only. */
#ifndef CH_PARAM_H
#define CH_PARAM_H

#include <stdint.h>

/* X(id, "ENV_NAME", kind, default_int, default_str, "help"); kind is P_INT (an integer, read with
 * param_int), P_BOOL (NCCL's 1/T/TRUE or 0/F/FALSE, read with param_int as 1 or 0) or P_STR. A row whose
 * help begins with "testing aid" is left out of the parameter API's listing unless NCCL_PARAM_DUMP_ALL
 * is true (NCCL lists only the parameters it documents). */
#define CH_PARAM_TABLE(X)                                                                          \
  X(DEBUG, "NCCL_DEBUG", P_STR, 0, "", "log level: VERSION, WARN, INFO, TRACE (empty = quiet)")    \
  X(DEBUG_SUBSYS, "NCCL_DEBUG_SUBSYS", P_STR, 0, "INIT,BOOTSTRAP,ENV",                             \
    "comma list of subsystems to log at INFO; ^ inverts; ALL")                                     \
  X(DEBUG_FILE, "NCCL_DEBUG_FILE", P_STR, 0, "", "log file (%h host, %p pid); default stdout")     \
  X(CONF_FILE, "NCCL_CONF_FILE", P_STR, 0, "",                                                     \
    "config file of KEY=VALUE lines (default ~/.nccl.conf); /etc/nccl.conf is read after it")     \
  X(ENV_PLUGIN, "NCCL_ENV_PLUGIN", P_STR, 0, "",                                                   \
    "environment plugin (NCCL's v2/v1 ABI), loaded once per process before any other parameter is read, whose getEnv then gives every other parameter in the environment's place (config files still fill what it leaves unset): path, library name, or X for libnccl-env-X.so; none = no plugin (default: libnccl-env.so if present)") \
  X(COMM_ID, "NCCL_COMM_ID", P_STR, 0, "", "fixed bootstrap root host:port (rank 0 listens there)") \
  X(SOCKET_IFNAME, "NCCL_SOCKET_IFNAME", P_STR, 0, "",                                             \
    "interfaces for sockets: prefix list, ^ excludes, = exact")                                    \
  X(SOCKET_FAMILY, "NCCL_SOCKET_FAMILY", P_STR, 0, "", "AF_INET or AF_INET6 (empty = any)")        \
  X(SOCKET_RETRY_CNT, "NCCL_SOCKET_RETRY_CNT", P_INT, 34, "", "connect retries before giving up")  \
  X(SOCKET_RETRY_SLEEP_MSEC, "NCCL_SOCKET_RETRY_SLEEP_MSEC", P_INT, 100, "",                       \
    "linear backoff step between connect retries (ms)")                                            \
  X(HOSTID, "NCCL_HOSTID", P_STR, 0, "", "host identity override (default hostname + boot id)")    \
  X(BOOT_MAX_CONNS, "CHORUS_BOOT_MAX_CONNS", P_INT, 64, "",                                        \
    "most bootstrap connections a rank keeps open with other ranks; past it the least recently used idle one is closed (and opened again when next needed), " \
    "its allgather and barrier partners last; lowered to share half of the process's descriptor limit (ulimit -n) among the bootstraps of its ranks, " \
    "never below 2*ceil(log2 nranks)+2 (those partners, and one more peer each way)") \
  X(ALGO, "NCCL_ALGO", P_STR, 0, "",                                                              \
    "algorithms allowed: [func:]list;... of Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT, Exchange, Direct, RecDbl, Rabenseifner (^ excludes); empty = auto") \
  X(PROTO, "NCCL_PROTO", P_STR, 0, "", "protocols allowed: [func:]list;... of LL, LL128, Simple (^ excludes)") \
  X(CUDA_LIBRARY, "CHORUS_CUDA_LIBRARY", P_STR, 0, "libcuda.so.1",                                \
    "the CUDA driver library to look for in the process (buffers are classified only if it is loaded)") \
  X(CUDA_ASYNC, "CHORUS_CUDA_ASYNC", P_INT, 1, "",                                                 \
    "1 = a call on device buffers with a CUDA stream returns at once and runs in that stream's order (copies, host function, stream wait); 0 = it synchronises the stream and completes before returning") \
  X(CUDA_STAGING_MAX_BYTES, "CHORUS_CUDA_STAGING_MAX_BYTES", P_INT, 1 << 30, "",                   \
    "pinned host memory per communicator for device buffers in flight; a call that would pass it waits for the streams to hand some back (one larger than it completes before returning)") \
  X(CUDA_STAGE_PIECE, "CHORUS_CUDA_STAGE_PIECE", P_INT, 4 << 20, "",                               \
    "ranks that stage device buffers through host memory (on different hosts): an AllReduce, Reduce, Broadcast, AllGather or ReduceScatter larger than this many bytes (all ranks' blocks counted) runs as pieces of it (at most 16, larger pieces past that), so that copies of one piece overlap the transfer of the next; every call of the communicator alike, whatever its buffers; rank 0's value holds; 0 = whole calls") \
  X(CUDA_STAGE_REDUCE, "CHORUS_CUDA_STAGE_REDUCE", P_INT, 1, "",                                   \
    "ranks that stage device buffers through host memory (on different hosts): 1 = the GPU reduces an AllReduce, Reduce or ReduceScatter (host memory only moves the inputs: an AlltoAll or AllGather, then Chorus's kernel combines the blocks), 0 = the CPU reduces the staged copies; on only where every rank allows it") \
  X(CUDA_DIRECT, "CHORUS_CUDA_DIRECT", P_INT, 1, "",                                               \
    "1 = calls on device buffers of ranks that share one GPU run there (kernels reading peers' buffers through CUDA IPC); 0 = through host memory") \
  X(CUDA_STAGE_BLOCKS, "CHORUS_CUDA_STAGE_BLOCKS", P_INT, 4, "",                                   \
    "ranks sharing one GPU: a kernel of at least this many blocks reads its call's pointer table from a device copy that a one-block kernel makes first, instead of from host memory in every block (0: always)") \
  X(CUDA_ONE_KERNEL, "CHORUS_CUDA_ONE_KERNEL", P_INT, 1, "",                                       \
    "ranks sharing one GPU: 1 = one kernel (rank 0's) does every rank's part of a call (processes' kernels take turns on the GPU), 0 = each rank's kernel its own part; rank 0's setting holds for all") \
  X(CUDA_UNROLL, "CHORUS_CUDA_UNROLL", P_INT, 4, "",                                               \
    "ranks sharing one GPU: above 1, a reduction kernel's thread keeps 4 16-byte vectors of each source in flight (2 for 1- and 2-byte types); 1 = one at a time") \
  X(CUDA_RELAY, "CHORUS_CUDA_RELAY", P_INT, -1, "",                                                \
    "ranks on one host whose device buffers cannot be shared directly (on different GPUs): their collectives (not sends and receives) relay through pinned host memory every rank maps, in chunks, reduced by each GPU; -1 = where ranks are on different GPUs, 1 = also instead of CHORUS_CUDA_DIRECT's path, 0 = never (whole buffers staged, reduced on the host)") \
  X(CUDA_RELAY_CHUNK, "CHORUS_CUDA_RELAY_CHUNK", P_INT, 1 << 20, "",                               \
    "the relay's chunk: bytes of each rank's input copied to host memory, then reduced, per step") \
  X(CUDA_RELAY_DEPTH, "CHORUS_CUDA_RELAY_DEPTH", P_INT, 4, "",                                     \
    "chunks of each rank in host memory at once (the relay's ring; pinned memory: ranks x depth x chunk)") \
  X(MEM_ALLOC_DEVICE, "CHORUS_MEM_ALLOC_DEVICE", P_INT, -1, "",                                     \
    "ncclMemAlloc gives CUDA device memory: 1 always, 0 never (host memory), -1 when the calling thread has a current CUDA context") \
  X(TORCH_CPP, "CHORUS_TORCH_CPP", P_INT, 1, "",                                                   \
    "torch_chorus: 1 = torch sees the C++ c10d Backend (built for the installed torch), 0 = the Python engine only") \
  X(NVTX_DISABLE, "NCCL_NVTX_DISABLE", P_INT, 0, "",                                              \
    "1 = no NVTX ranges around the calls (made only when NVTX_INJECTION64_PATH names a tool, e.g. under Nsight Systems, and the process uses CUDA)") \
  X(TUNER_PLUGIN, "NCCL_TUNER_PLUGIN", P_STR, 0, "",                                              \
    "tuner plugin: path, library name, or X for libnccl-tuner-X.so; none = no plugin (default: libnccl-tuner.so if present)") \
  X(PROFILER_PLUGIN, "NCCL_PROFILER_PLUGIN", P_STR, 0, "",                                        \
    "profiler plugin (NCCL's v7/v6/v5 ABI): path, library name, or X for libnccl-profiler-X.so; none = no plugin (default: libnccl-profiler.so if present)") \
  X(PARAM_DUMP_ALL, "NCCL_PARAM_DUMP_ALL", P_BOOL, 0, "",                                        \
    "true = ncclParamGetAllParameterKeys and ncclParamDumpAll include the testing aids too")          \
  X(BUFFSIZE, "NCCL_BUFFSIZE", P_INT, 1 << 21, "", "Simple FIFO bytes per connection (8 slots)")   \
  X(LL_BUFFSIZE, "NCCL_LL_BUFFSIZE", P_INT, 1 << 18, "", "LL FIFO bytes per connection")           \
  X(LL128_BUFFSIZE, "NCCL_LL128_BUFFSIZE", P_INT, 1 << 20, "", "LL128 FIFO bytes per connection")  \
  X(P2P_MEM, "CHORUS_P2P_MEM", P_INT, 64 << 20, "",                                                \
    "bytes of receive FIFOs per rank for its per-peer (send/recv, AlltoAll, Gather, Scatter) connections: " \
    "each FIFO is this divided by the peers (at most NCCL_BUFFSIZE + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE " \
    "capped at 512+64+256 KiB, at least 96 KiB); ranks must agree")                                \
  X(P2P_PEERS, "CHORUS_P2P_PEERS", P_INT, 0, "",                                                   \
    "most peers with live per-peer FIFOs per rank (0: as many as CHORUS_P2P_MEM holds at the FIFO " \
    "size); the least recently used are released at a call boundary and re-made when next needed; " \
    "a group that meets more same-host peers than the smallest of any rank's runs in waves; "       \
    "a communicator's ncclConfig_t.maxP2pPeers, or NCCL_P2P_MAX_PEERS, takes its place")           \
  X(P2P_MAX_PEERS, "NCCL_P2P_MAX_PEERS", P_INT, 0, "",                                              \
    "NCCL's cap on peers with per-peer connections (as CHORUS_P2P_PEERS); overrides every "         \
    "communicator's ncclConfig_t.maxP2pPeers, as in NCCL (<= 0: unset)")                            \
  X(MIN_NCHANNELS, "NCCL_MIN_NCHANNELS", P_INT, 1, "", "minimum channels (rings) per collective")  \
  X(MAX_NCHANNELS, "NCCL_MAX_NCHANNELS", P_INT, 1, "", "maximum channels (rings) per collective")  \
  X(SHM_DISABLE, "NCCL_SHM_DISABLE", P_INT, 0, "", "1 = never use shared memory between processes") \
  X(COMM_BLOCKING, "NCCL_COMM_BLOCKING", P_INT, -1, "", "0 = nonblocking communicators (-1 = config)") \
  X(INIT_TIMEOUT, "CHORUS_INIT_TIMEOUT", P_INT, 120, "",                                           \
    "seconds a rank waits for all ranks to join at init before reporting who is missing (0: no limit)") \
  X(TIMEOUT, "CHORUS_TIMEOUT", P_INT, 1800, "",                                                    \
    "seconds a call may wait without any progress before it fails with ncclTimeout and reports what it waits for (0 = never)") \
  X(DUMP_SIGNAL, "CHORUS_DUMP_SIGNAL", P_STR, 0, "",                                              \
    "signal (e.g. SIGUSR1) on which every rank blocked in a call logs what it waits for and every communicator writes its flight recorder (empty = none)") \
  X(FLIGHT_RECORDER, "CHORUS_FLIGHT_RECORDER", P_INT, 2000, "",                                  \
    "calls each communicator's flight recorder keeps (the last N, written out on a timeout, mismatch, dead peer, abort, CHORUS_DUMP_SIGNAL or request; 0 = off)") \
  X(DUMP_DIR, "CHORUS_DUMP_DIR", P_STR, 0, "",                                                     \
    "folder for flight recorder dumps (default $TMPDIR/chorus-dump-<uid>, made 0700; chorus-info --flight reads it)") \
  X(TRACE, "CHORUS_TRACE", P_STR, 0, "",                                                           \
    "folder: each rank writes a Chrome/Perfetto trace of its calls there (chorus-info --trace merges them; empty = off)") \
  X(CLOCK_SKEW_US, "CHORUS_CLOCK_SKEW_US", P_INT, 0, "",                                            \
    "testing aid: microseconds added to this process's clock for dumps and traces (the alignment at init removes it)") \
  X(STALL_QUERY, "CHORUS_STALL_QUERY", P_INT, 1, "",                                               \
    "1 = each process answers stall queries (peers' stall reports, chorus-info --stall) on its bootstrap interface; 0 = no such listener (reports show this process's ranks only)") \
  X(SPIN_COUNT, "CHORUS_SPIN_COUNT", P_INT, 2000, "",                                              \
    "polls before a waiting rank starts to yield the CPU")                                         \
  X(SPIN_US, "CHORUS_SPIN_US", P_INT, 500, "",                                                      \
    "microseconds a rank busy-polls for a peer in a collective before yielding (0 when oversubscribed)") \
  X(YIELD_US, "CHORUS_YIELD_US", P_INT, 2000, "",                                                    \
    "microseconds a waiting rank yields its CPU (more ranks than CPUs) before sleeping until woken") \
  X(EXCHANGE_MAX_BYTES, "CHORUS_EXCHANGE_MAX_BYTES", P_INT, -1, "",                               \
    "largest AllReduce (bytes) done by Exchange instead of Ring on two ranks (-1 = always)")       \
  X(DIRECT_MIN_BYTES, "CHORUS_DIRECT_MIN_BYTES", P_INT, 0, "",                                      \
    "smallest AllReduce (bytes) done Direct when all ranks are threads of one process (-1 = never)") \
  X(SHM_DIRECT_MIN_BYTES, "CHORUS_SHM_DIRECT_MIN_BYTES", P_INT, 256 << 10, "",                      \
    "smallest AllReduce (bytes) done Direct between processes of one host on ncclMemAlloc buffers (-1 = never)") \
  X(CMA, "CHORUS_CMA", P_INT, 0, "",                                                                 \
    "Direct AllReduce between processes of one host on buffers not from ncclMemAlloc: 1 = copy straight between the processes' memory (process_vm_readv/writev, where the kernel lets ranks of one user do it; probed at init), 0 = through FIFOs (default: the kernel's copy measured at 35-55% of memcpy here, slower than the FIFOs; build/bin/memcpy_bench shows a machine's); ranks must agree") \
  X(CMA_MIN_BYTES, "CHORUS_CMA_MIN_BYTES", P_INT, 1 << 20, "",                                       \
    "smallest AllReduce (bytes) done Direct by cross-memory copies (CHORUS_CMA) when some buffer is not from ncclMemAlloc; smaller ones use FIFOs") \
  X(REPRODUCIBLE, "CHORUS_REPRODUCIBLE", P_STR, 0, "off",                                        \
    "floating-point AllReduce/ReduceScatter/Reduce: off, order (the same bits whatever the algorithm, protocol, channels or placement, for a given rank count) or exact (the correctly rounded exact sum: also the same for any rank count); ranks must agree (docs/REPRODUCIBLE.md)") \
  X(WIRE_FORMAT, "CHORUS_WIRE_FORMAT", P_STR, 0, "off",                                           \
    "wire format of float32/bfloat16 collectives' network hops: off, bf16, fp16, fp8e4m3, fp8e5m2 or mx8; a trailing ! uses it even where the cost model's link outruns the conversion (docs/WIRE.md)") \
  X(WIRE_HOPS, "CHORUS_WIRE_HOPS", P_STR, 0, "net",                                                 \
    "hops a wire format applies to: net (network connections only; shared memory stays exact) or all") \
  X(WIRE_MAX_LINK_MBS, "CHORUS_WIRE_MAX_LINK_MBS", P_INT, 1000, "",                                  \
    "a wire format without ! applies when the link (the cost model's net_bw, or the slowest rank's NIC speed where slower; MB/s) is at most this") \
  X(STREAM_MIN_BYTES, "CHORUS_STREAM_MIN_BYTES", P_INT, 8 << 20, "",                               \
    "smallest result (bytes) written with streaming stores, bypassing the cache (-1 = never)")     \
  X(WIRE_VERSION, "CHORUS_WIRE_VERSION", P_INT, 1, "",                                             \
    "wire-protocol version announced at init (testing aid: ranks must agree)")                    \
  X(RING_ORDER, "CHORUS_RING_ORDER", P_STR, 0, "",                                                \
    "testing aid: ring order after grouping by host: hosts (default), reverse, interleave; ranks must agree") \
  X(TUNE_FILE, "CHORUS_TUNE_FILE", P_STR, 0, "",                                                   \
    "cost model constants measured on this machine (written by chorus-info --calibrate); ranks must agree") \
  X(TREE_PER_RANK, "CHORUS_TREE_PER_RANK", P_INT, 0, "",                                          \
    "Tree algorithm: 1 = every rank is a node of the binary trees (default 0: hosts are, a chain inside each); ranks must agree") \
  X(SECRET_FILE, "CHORUS_SECRET_FILE", P_STR, 0, "",                                               \
    "file (mode 0600) holding the job secret for NCCL_COMM_ID jobs; CHORUS_SECRET (environment only, never printed) is the alternative") \
  X(P2P_DISABLE, "NCCL_P2P_DISABLE", P_INT, 0, "",                                                 \
    "1 = no direct transport between threads of one process (with NCCL_SHM_DISABLE=1: the network)") \
  X(SOCKET_NTHREADS, "NCCL_SOCKET_NTHREADS", P_INT, 1, "",                                         \
    "socket transport: with NCCL_NSOCKS_PERTHREAD, sockets per peer a large transfer is striped over "  \
    "(their product, at most 16: a channel each; threads: the ranks and the one proxy)")               \
  X(NSOCKS_PERTHREAD, "NCCL_NSOCKS_PERTHREAD", P_INT, 1, "",                                       \
    "socket transport: sockets per thread (see NCCL_SOCKET_NTHREADS)")                                \
  X(NET_SPIN_US, "CHORUS_NET_SPIN_US", P_INT, 0, "",                                               \
    "microseconds the network proxy thread busy-polls after its last progress before sleeping in epoll") \
  X(NET_DIRECT_MAX_BYTES, "CHORUS_NET_DIRECT_MAX_BYTES", P_INT, 4 << 20, "",                       \
    "network steps up to this many bytes are sent, and received while it waits, by the rank's own "  \
    "thread instead of the proxy (0 = the proxy moves every step)")                                  \
  X(NET_SOCKBUF_BYTES, "CHORUS_NET_SOCKBUF_BYTES", P_INT, 0, "",                                   \
    "SO_SNDBUF/SO_RCVBUF of network transport sockets (0 = kernel autotuning)") \
  X(NET_LINK_TIMEOUT_MS, "CHORUS_NET_LINK_TIMEOUT_MS", P_INT, 20000, "",                          \
    "a network connection whose peer host stops answering (data or keepalive probes unacknowledged) fails after this long (0 = kernel defaults)") \
  X(NET, "NCCL_NET", P_STR, 0, "",                                                                  \
    "the network between hosts, by name: Socket, OFI (libfabric), or an external plugin's name (empty = NCCL's order: plugins, OFI when its provider is RDMA, Socket)") \
  X(NET_PLUGIN, "NCCL_NET_PLUGIN", P_STR, 0, "",                                                    \
    "net plugins to try: comma list of paths, library names, or X for libnccl-net-X.so; none = no plugin (default: libnccl-net.so if present)") \
  X(SOCKET_NET, "CHORUS_SOCKET_NET", P_INT, 0, "",                                                 \
    "when the network is Socket: 0 = the socket transport (ranks and its proxy move the sockets themselves), 1 = the same sockets behind NCCL's net interface, driven by the fabric transport like OFI or a plugin; ranks must agree") \
  X(FABRIC_LIBRARY, "CHORUS_FABRIC_LIBRARY", P_STR, 0, "libfabric.so.1",                           \
    "the libfabric library the OFI network loads at run time")                                       \
  X(OFI_CQ_SIZE, "CHORUS_OFI_CQ_SIZE", P_INT, 16384, "",                                             \
    "OFI network: completion queue entries per device (every request in flight needs one)")          \
  X(OFI_RMA, "CHORUS_OFI_RMA", P_INT, -1, "",                                                       \
    "OFI network: data by RMA write with remote CQ data after a clear-to-send from the receiver (rendezvous): 1 = whenever the provider has FI_RMA and 8-byte CQ data, -1 = on RDMA providers only, 0 = never (tagged messages); ranks must agree") \
  X(FABRIC_SPIN_US, "CHORUS_FABRIC_SPIN_US", P_INT, 50, "",                                          \
    "fabric transport: microseconds its progress thread polls requests after the last progress before it backs off (sleeps of growing length: up to 50 us while a rank waits or a send is in flight, 20 ms otherwise)")

enum param_kind { P_INT, P_STR, P_BOOL };

enum param_id {
#define CH_PARAM_ENUM(id, env, kind, di, ds, help) PARAM_##id,
  CH_PARAM_TABLE(CH_PARAM_ENUM)
#undef CH_PARAM_ENUM
  PARAM_COUNT
};

int64_t param_int(enum param_id id);
const char* param_str(enum param_id id); /* never NULL; "" when unset */
int param_is_set(enum param_id id);      /* set by environment or config file */

/* Introspection for chorus-info and ncclParam-style tools. */
struct param_info {
  const char* env;
  enum param_kind kind;
  int64_t default_int;
  const char* default_str;
  const char* help;
  const char* source; /* "default", "environment", or the config file path */
  int published;      /* listed by the parameter API without NCCL_PARAM_DUMP_ALL (not a testing aid) */
};
void param_describe(enum param_id id, struct param_info* out);
/* The variable's name without loading its value; NULL for an id out of range. */
const char* param_name(enum param_id id);
/* The id of the row named env, or -1. */
int param_find(const char* env);
/* Forget cached values (tests change the environment between cases). */
void param_reset(void);

#endif
