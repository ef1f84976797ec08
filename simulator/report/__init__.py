"""simulator/report"""
