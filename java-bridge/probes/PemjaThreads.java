// The PEMJA threading probe of java-bridge/README.md ("PEMJA across threads"). Run:
//   SP=.venv/lib/python3.11/site-packages; javac -d /tmp -cp $SP/pyflink/opt/flink-python-1.20.5.jar java-bridge/probes/PemjaThreads.java
//   PATH=.venv/bin:$PATH java -cp $SP/pyflink/opt/flink-python-1.20.5.jar:/tmp PemjaThreads .venv/bin/python $SP
import pemja.core.PythonInterpreter;
import pemja.core.PythonInterpreterConfig;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.CompletableFuture;

public class PemjaThreads {
    public static final AtomicLong calls = new AtomicLong();
    public static final CompletableFuture<String> done = new CompletableFuture<>();
    public static class Listener {
        public void durable(long id) { calls.incrementAndGet(); }
        public void failed(long id, String msg) { done.complete(Thread.currentThread().getName() + ":" + msg); }
    }
    public static void main(String[] a) throws Exception {
        PythonInterpreterConfig cfg = PythonInterpreterConfig.newBuilder()
            .setPythonExec(a[0]).addPythonPaths(a[1]).setExcType(PythonInterpreterConfig.ExecType.MULTI_THREAD).build();
        PythonInterpreter py = new PythonInterpreter(cfg);
        py.set("listener", new Listener());
        py.exec("import threading, time\n"
              + "progress = [0]\n"
              + "def work():\n"
              + "    for i in range(200):\n"
              + "        time.sleep(0.001)\n"
              + "        x = sum(range(2000))\n"
              + "        progress[0] += 1\n"
              + "        listener.durable(i)\n"
              + "    listener.failed(7, threading.current_thread().name)\n"
              + "t = threading.Thread(target=work, daemon=True)\n"
              + "t.start()\n");
        long t0 = System.nanoTime();
        // Java side busy / sleeping, not in Python
        Thread.sleep(300);
        System.out.println("calls after 300ms in Java: " + calls.get());
        System.out.println("progress via python: " + py.get("progress"));
        System.out.println("done: " + done.get(10, java.util.concurrent.TimeUnit.SECONDS));
        System.out.println("calls: " + calls.get() + " in ms " + (System.nanoTime()-t0)/1e6);
        // Task thread in a long Python call while the thread runs: GIL sharing
        py.exec("def busy(n):\n    s=0\n    for i in range(n): s+=i\n    return s\n");
        py.exec("progress[0]=0\nt2 = threading.Thread(target=work, daemon=True)\nt2.start()\n");
        long t1 = System.nanoTime();
        py.invoke("busy", 20000000);
        System.out.println("busy call ms " + (System.nanoTime()-t1)/1e6 + " progress during it " + py.get("progress"));
        py.close();
    }
}
